"""Server-Sent Events: how `:stream` frames a streaming model's steps, and the response of one stream per front.

Each step is `data: {"predictions": [chunk per instance]}`, then `event: end` (or `event: error` with the JSON
error body, when the stream fails after its first step was sent). Everything up to the first step is the driver's
(service/drive.py `astreamed` / `streamed`: errors answered like `:predict`'s, the time to first chunk noted); the
responses here write the steps from the first on. A stream's exchange stays open until its last event: each
response here closes it, exactly once, after closing the model's generator.

A client that stops reading would hold its stream for as long as its connection lasts: the event loop's writes wait
for the socket to drain. So each event must be taken within `--read-timeout-s` (the write deadline; sync's socket
timeout bounds its writes the same way); past it, the generator is closed, the request counted as the client's
failure (499), and the connection closed: the response ends without its last chunk, which is how an ASGI app has
uvicorn drop a connection mid-response. In hybrid the model worker is let go sooner, once the client is a buffer
of steps behind (core/executors.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from twinserve.core.streams import AsyncSteps, Steps, step_or_none
from twinserve.errors import ClientDisconnected, TwinserveError, error_payload
from twinserve.protocol.v1 import dumps
from twinserve.service.drive import StreamStart
from twinserve.service.exchange import Exchange
from twinserve.service.reply import Reply
from twinserve.service.response import header_fields
from twinserve.service.routes import EVENT_STREAM

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

__all__ = [
    "SSE_END",
    "SSE_HEADERS",
    "AsgiEventStream",
    "WsgiEventStream",
    "client_left",
    "sse_error",
    "sse_step",
]

logger = logging.getLogger("twinserve.sse")

#: The last event of a stream that reached its end.
SSE_END = b"event: end\ndata: {}\n\n"
#: Proxies (nginx) must pass each event on at once rather than buffer the response.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: The head of every stream, written by the one response writer (service/response.py). Its content type is one of
#: its headers: as the type of a reply, a text type would gain a charset, which sync's (Flask's) does not send.
_HEAD = Reply(200, b"", {"Content-Type": EVENT_STREAM, **SSE_HEADERS}, content_type="")


def sse_step(exchange: Exchange, step: list[Any], expected: int) -> bytes:
    """One step as an SSE event (orjson never writes a newline, so the JSON is one `data:` line)."""
    return b"data: " + exchange.codecs.v1.encode(step, expected) + b"\n\n"


def sse_error(error: TwinserveError, request_id: str) -> bytes:
    return b"event: error\ndata: " + dumps(error_payload(error, request_id)) + b"\n\n"


class AsgiEventStream:
    """The ASGI response of one stream: SSE events as the steps come, while the client is there; closes the
    generator, then the exchange (which counts the request once), at the end."""

    def __init__(self, exchange: Exchange, start: StreamStart[AsyncSteps]) -> None:
        self.exchange, self.start = exchange, start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start, exchange = self.start, self.exchange
        headers = header_fields(_HEAD, exchange.request_id, streamed=True)
        watcher = asyncio.get_running_loop().create_task(client_left(receive))
        last: bytes | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            step = start.first
            while step is not None and not watcher.done():
                body = sse_step(exchange, step, start.expected)
                await self._send_within(send, {"type": "http.response.body", "body": body, "more_body": True})
                step = await self._next(watcher)
            if not watcher.done():  # else the client left first: the exchange closes as 499
                exchange.succeeded()
                last = SSE_END
        except _Stalled as stalled:
            exchange.failed(ClientDisconnected(str(stalled)))  # logged as the stream closes, below
        except ClientDisconnected as behind:  # it fell too far behind (core/executors.py): no last event to send
            exchange.failed(behind)
        except Exception as exc:
            last = sse_error(exchange.failed(exc), exchange.request_id)
        finally:
            watcher.cancel()
            try:
                await start.steps.aclose()
            except TwinserveError:
                pass  # the model's finally raised: model_code logged it
            finally:
                if exchange.error_code == ClientDisconnected.code:
                    logger.info("client left the stream of %s; its generator was closed", exchange.context.path)
                exchange.close()  # counted before the client can see the end
        if last is not None:
            await send({"type": "http.response.body", "body": last, "more_body": False})

    async def _send_within(self, send: Send, message: dict[str, Any]) -> None:
        """`send`, unless the client reads nothing for the write deadline (then _Stalled)."""
        timeout = self.exchange.service.config.read_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await send(message)
        except TimeoutError:
            raise _Stalled(f"the client read nothing for {timeout:g} s (--read-timeout-s)") from None

    async def _next(self, watcher: asyncio.Task[None]) -> list[Any] | None:
        """The next step, or None at the end or once the client has left (the step in progress is cancelled)."""
        step = asyncio.ensure_future(step_or_none(self.start.steps))
        await asyncio.wait([step, watcher], return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            step.cancel()
            await asyncio.wait([step])
            return None
        return step.result()


class _Stalled(Exception):
    """A stream's client read nothing for the write deadline."""


async def client_left(receive: Receive) -> None:
    # The request body has been read: the next ASGI message can only be the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


class WsgiEventStream:
    """The response body of one stream: SSE events written as the steps come; `close()` (always called by the
    WSGI server, even if the body was never iterated) closes the generator, then the exchange, once."""

    def __init__(self, exchange: Exchange, start: StreamStart[Steps]) -> None:
        self.exchange, self.steps = exchange, start.steps
        self.first, self.expected = start.first, start.expected
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            if self.first is not None:
                yield sse_step(self.exchange, self.first, self.expected)
                for step in self.steps:
                    yield sse_step(self.exchange, step, self.expected)
            self.exchange.succeeded()
            last = SSE_END
        except Exception as exc:
            last = sse_error(self.exchange.failed(exc), self.exchange.request_id)
        self.close()  # counted before the client can see the end
        yield last

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.steps.close()
        except TwinserveError:
            pass  # the model's finally raised: model_code logged it
        finally:
            exchange = self.exchange
            if exchange.error_code == ClientDisconnected.code:  # closed before its end: the client left
                context = exchange.context
                where = f"{context.method} {context.path} ({context.request_id})"
                logger.info("client left the stream of %s; its generator was closed", where)
            exchange.close()
