"""uvicorn's httptools protocol with what it lacks and twinserve promises in every architecture: a deadline for a
request's head, bounds on its size, and twinserve's JSON error for what the parser refuses.

`HttpToolsProtocol` is uvicorn's own, as shipped; this subclass only adds (uvicorn has no head deadline and, with
httptools, no header limit; xinference wraps it the same way against slowloris, xorbitsai/inference #5213):
- `--read-timeout-s` from a connection's start, or from a request's first read, until its head is whole;
- a request target past `--max-request-line` (414), a header field past `--max-header-bytes`, more than
  `--max-header-count` of them, or a head past their sum while it arrives (431);
- what llhttp refuses answered 400 `malformed_http` with twinserve's body, after the answers to the requests read
  before it (RFC 9112 section 9.3.2), counted once when no app saw it;
- the connections waiting behind a new one accepted with it (servers/asgi/accept.py);
- a response's head and body written in one send (`_OneWritePerTurn`), as a response's bytes were before;
- each request's arrival in its scope (`DISCONNECT_EXTENSION`): whether its client has gone, and its body once it
  has all arrived, so the app needs no watcher task nor `receive` for them (fronts/disconnect.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast

from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from twinserve.errors import HeadersTooLarge, MalformedHttp, TwinserveError, UriTooLong
from twinserve.fronts.disconnect import DISCONNECT_EXTENSION
from twinserve.servers.asgi.accept import accept_waiting
from twinserve.servers.http1 import Limits
from twinserve.servers.served import Served
from twinserve.service.contract import raw_error_response

__all__ = ["BoundedHttpToolsProtocol"]


class _OneWritePerTurn:
    """A connection's transport whose writes within one turn of the event loop go out as one: uvicorn writes a
    response's head and its body apart, a send each, where one would do. Everything else is the transport's."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending:
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:  # asked on every response: not through __getattr__
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


#: Body bytes an `_Arrival` keeps for the app to take whole; past them the app reads through `receive`.
_WHOLE_BODY = 65536


class _Arrival:
    """One request's body as it arrives and whether its client has gone, as the app reads them
    (`DISCONNECT_EXTENSION`). It holds nothing of the connection: the scope holds it, and nothing it holds holds
    the scope."""

    __slots__ = ("chunks", "complete", "gone", "size", "wait")

    def __init__(self, expect_continue: bool) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = self.gone = False
        #: Behind `Expect: 100-continue` the body is the client's to send once asked (through `receive`).
        self.wait = expect_continue

    def disconnected(self) -> bool:
        return self.gone

    def body(self) -> bytes | None:
        """The whole body, taken once; None while any of it is still to come (or was taken, or was too large)."""
        if not self.complete or self.gone or self.wait or self.size > _WHOLE_BODY:
            return None
        self.wait = True
        body, self.chunks = b"".join(self.chunks), []
        return body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """One connection (see the module). uvicorn is given `functools.partial(BoundedHttpToolsProtocol, served=...)`
    and adds its own keyword arguments."""

    def __init__(
        self,
        config: UvicornConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        served: Served,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.served = served
        self.limits = Limits.of(served.config)
        self.read_timeout = served.config.read_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None
        #: Between a request's first byte and its head's end; between its first byte and its end.
        self._in_head = self._in_message = False
        self._head_bytes = self._header_count = 0
        #: Why a parser callback refused the request (else llhttp refused it itself).
        self._refusal: TwinserveError | None = None
        #: The error answer owed once the requests read before the refused one are answered, the last of which is
        #: `_owed_after`; the request read before the one being read.
        self._owed: bytes | None = None
        self._owed_after: Any = None
        self._previous: Any = None
        #: The arrivals of the requests read and not answered yet, oldest first; the one being read, last.
        self._arrivals: deque[_Arrival] = deque()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _OneWritePerTurn(transport, self.loop)))
        self._arm_head_deadline()
        accept_waiting(self.loop, self._sibling)  # the connections behind it in the accept queue (accept.py)

    def _sibling(self) -> BoundedHttpToolsProtocol:
        """A protocol for another connection of the same server."""
        return BoundedHttpToolsProtocol(self.config, self.server_state, self.app_state, self.loop, served=self.served)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        for arrival in self._arrivals:
            arrival.gone = True
        self._arrivals.clear()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._owed is not None:
            return  # nothing after a refused request is HTTP we can frame
        counting = self._in_head or not self._in_message
        super().data_received(data)
        # Counted after parsing, so a read that ends the head and carries a body is not held against it; what
        # httptools buffers of an unfinished header stays bounded by the limit plus one read.
        if counting and self._in_head and self._owed is None and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head:
                self._refusal = HeadersTooLarge()
                self.send_400_response("head too large")
            elif self._head_timer is None:  # a head that arrives whole in one read costs no timer
                self._arm_head_deadline()

    # -- llhttp's callbacks --------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = self._in_message = True
        self._head_bytes = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_request_line:
            self._refusal = UriTooLong()
            raise self._refusal

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a chunked body's trailer fields: never part of the head the app's checks saw
        self._header_count += 1
        limits = self.limits
        if self._header_count > limits.max_header_count or len(name) + len(value) + 2 > limits.max_header_bytes:
            self._refusal = HeadersTooLarge()
            raise self._refusal
        super().on_header(name, value.rstrip(b" \t"))  # not part of the value (RFC 9110 5.5); uvicorn 0.54 keeps it

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_deadline()
        self._previous = self.cycle
        arrival = _Arrival(self.expect_100_continue)
        self._arrivals.append(arrival)
        self.scope["extensions"] = {DISCONNECT_EXTENSION: {"disconnected": arrival.disconnected, "body": arrival.body}}
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self._arrivals:
            arrival = self._arrivals[-1]
            arrival.size += len(body)
            if arrival.size <= _WHOLE_BODY:
                arrival.chunks.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        if self._arrivals:
            self._arrivals[-1].complete = True
        super().on_message_complete()

    # -- refusals ------------------------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """Answer what the parser refused with twinserve's error (uvicorn's own writes plain text), and close."""
        error, self._refusal = self._refusal or MalformedHttp(private=msg), None
        cycle = self.cycle
        if self._in_message and not self._in_head and cycle is not None:  # its body broke: its app was handed it
            if self.pipeline and self.pipeline[0][0] is cycle:
                self.pipeline.popleft()  # read behind another: it never runs, so no app counts it
                cycle = self._previous
            else:
                if not cycle.response_started:  # its app runs on, and counts what it meets (the client gone)
                    self.transport.write(raw_error_response(error))
                self.transport.close()
                return
        if self.served.service is not None:  # no app saw it: counted here, once, as the sync worker counts it
            self.served.service.unparsed(error)
        if cycle is not None and not cycle.response_complete:
            self._owed, self._owed_after = raw_error_response(error), cycle  # after the answers read before it
            self.flow.pause_reading()
            return
        self.transport.write(raw_error_response(error))
        self.transport.close()

    def on_response_complete(self) -> None:
        if self._arrivals:
            self._arrivals.popleft()
        super().on_response_complete()
        if self._owed is not None and self._owed_after.response_complete and not self.transport.is_closing():
            self.transport.write(self._owed)
            self.transport.close()

    # -- the head's deadline -------------------------------------------------------------------------------------
    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_timer = self.loop.call_later(self.read_timeout, self._head_late)

    def _cancel_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()  # a head (or a new connection's first byte) not in by its deadline
