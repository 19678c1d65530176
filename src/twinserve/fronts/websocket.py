"""WebSocket sockets on the async front: `/v1/models/{model}/ws` (async and hybrid architectures).

Every message becomes its own task awaiting `ModelRuntime.apredict`, so messages from all sockets meet in the
model's batcher, and each is answered as soon as its outputs are ready, in any order (messages are described in
`twinserve.protocol.websocket`). Each message counts and logs like a request (endpoint `websocket`, its id as the
request id).

Per socket at most `--ws-max-pending` messages wait for their answers; one more is answered at once with a
`too_many_pending` error (503), so a socket never holds unbounded work, and a client that stops reading its
answers stops being read. Close codes:

- 1000: the client closed;
- 1001: the server is shutting down (after the answers already owed are sent, within `--graceful-timeout`);
- 1007: a text message that is not UTF-8 (closed by the protocol layer);
- 1009: a message over `--ws-max-message-bytes`; answers still owed are dropped;
- 1011: an internal error.

A foreign Host (`--allowed-hosts`), a missing or wrong API key (when keys are on), a foreign Origin (neither the
same origin, nor one `--cors-origins` allows, nor on a named allowed host), an unknown model, a model still
loading or a server shutting down refuse the handshake with the HTTP contract's status and JSON error body (400,
401/429, 403, 404, 503), or close with 1008 under a server without ASGI's denial-response
extension. Each message is charged to the handshake key's `--rate-limit-per-key`.
A client that leaves mid-stream cancels its unanswered messages: queued ones leave the batcher unbatched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from twinserve.core.admission import PRIORITY_HEADER, TIMEOUT_HEADER
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import (
    ClientDisconnected,
    CorsRejected,
    RateLimited,
    ShuttingDown,
    TooManyPending,
    TwinserveError,
)
from twinserve.fronts.asgi_reply import AsgiReply
from twinserve.protocol.websocket import BinaryMessage, MessageError, WebSocketCodec
from twinserve.service import drive
from twinserve.service.admission import RequestHead, admit_socket
from twinserve.service.contract import Service
from twinserve.service.exchange import Exchange, decode_off_loop
from twinserve.service.routes import error_shape

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_POLICY",
    "CLOSE_TOO_BIG",
    "OpenSockets",
    "deny_handshake",
    "websocket_endpoint",
]

logger = logging.getLogger("twinserve.websocket")

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011
#: The endpoint name WebSocket messages are counted and logged under.
ENDPOINT = "websocket"
_DENIAL_EXTENSION = "websocket.http.response"


class OpenSockets:
    """The open sockets of one server process, so that a shutdown can drain them: answers sent, then 1001."""

    def __init__(self) -> None:
        self._open: set[_Socket] = set()
        self.closing = False
        #: Open sockets per client address (`--ws-max-per-client`).
        self._per_client: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._open)

    def of(self, client: str) -> int:
        """How many sockets `client` holds open here."""
        return self._per_client[client]

    def add(self, socket: _Socket) -> None:
        self._open.add(socket)
        self._per_client[socket.client] += 1

    def discard(self, socket: _Socket) -> None:
        if socket in self._open:
            self._open.discard(socket)
            self._per_client[socket.client] -= 1
            if not self._per_client[socket.client]:
                del self._per_client[socket.client]

    async def aclose(self, timeout: float) -> None:
        """Refuse new sockets and messages, give open sockets `timeout` seconds to answer, close them (1001)."""
        self.closing = True
        if self._open:
            logger.info("draining %d WebSocket stream(s) before shutting down", len(self._open))
            drained = await asyncio.gather(*(s.drain(timeout) for s in list(self._open)), return_exceptions=True)
            for outcome in drained:
                if isinstance(outcome, Exception):
                    logger.error("a WebSocket stream failed to drain", exc_info=outcome)


class _Socket:
    """One accepted socket: reads messages, runs each as a task, sends the answers."""

    def __init__(
        self,
        websocket: WebSocket,
        service: Service,
        runtime: ModelRuntime,
        codec: WebSocketCodec,
        key_id: str | None,
        client: str = "",
    ) -> None:
        self.websocket = websocket
        self.client = client  # its address, as the per-client cap counts it
        self.service = service
        self.key_id = key_id  # the API key of the handshake: each message is charged to its rate limit
        self.runtime = runtime
        self.codec = codec
        self.path: str = websocket.scope["path"]
        # The handshake's head is each message's: its deadline and priority headers apply to every message.
        headers = websocket.headers
        self.head = RequestHead(
            ENDPOINT, runtime.name, timeout=headers.get(TIMEOUT_HEADER), priority=headers.get(PRIORITY_HEADER)
        )
        self.max_pending = service.config.ws_max_pending
        self.max_bytes = service.config.effective_ws_max_message_bytes
        self.pending: set[asyncio.Task[None]] = set()
        self.draining = False
        self.closed = False  # no more answers can be sent (the client left, or a close was sent)
        self._close_sent = False
        #: An answer must be taken within this (--read-timeout-s): else the client is cut off (`_send`).
        self.write_deadline = service.config.read_timeout_s
        self._stalled = False
        self._reader: asyncio.Task[Any] | None = None

    def gone(self) -> bool:
        """Whether no answer can be sent any more (a message's predict leaves the batcher then)."""
        return self.closed

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._reader = asyncio.current_task()
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data: str | bytes = message["text"] if message.get("text") is not None else message.get("bytes") or b""
                if _size(data, self.max_bytes) > self.max_bytes:
                    limit = f"{self.max_bytes}-byte limit (--ws-max-message-bytes)"
                    await self.close(CLOSE_TOO_BIG, f"message exceeds the {limit}")
                    return
                refusal: TwinserveError | None = None
                if self.draining:
                    refusal = ShuttingDown("the server is shutting down: reconnect and send this message again")
                elif len(self.pending) >= self.max_pending:
                    refusal = TooManyPending(
                        f"{len(self.pending)} messages on this socket await their answers "
                        f"(--ws-max-pending {self.max_pending}); send this one again after an answer arrives"
                    )
                if refusal is not None:
                    await self._answer(data, refusal)  # awaited here: a flooding client is read no faster
                    continue
                task = loop.create_task(self._answer(data))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
        except asyncio.CancelledError:
            if not self._stalled:
                raise
            # Cut off (`_send`): no close frame, which would wait on the same full socket; the endpoint returns
            # and the server drops the connection, its owed answers cancelled below.
        except Exception:
            logger.exception("WebSocket stream on %s failed", self.path)
            await self.close(CLOSE_INTERNAL_ERROR, "internal error")
        finally:
            self.closed = True
            await self._cancel_pending()

    async def drain(self, timeout: float) -> None:
        """Stop taking messages, wait up to `timeout` seconds for the answers owed, then close with 1001."""
        self.draining = True
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=timeout)
        await self.close(CLOSE_GOING_AWAY, "the server is shutting down")

    async def close(self, code: int, reason: str) -> None:
        """Drop the answers still owed, then close (once)."""
        self.closed = True
        await self._cancel_pending()
        if not self._close_sent:
            self._close_sent = True
            with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected):  # the client left first
                await self.websocket.close(code, reason)

    async def _cancel_pending(self) -> None:
        tasks = list(self.pending)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _answer(self, data: str | bytes, refusal: TwinserveError | None = None) -> None:
        """Decode one message, predict, send the answer (or the error); its exchange counts it like a request."""
        message = _Message(self, data)
        binary = isinstance(data, bytes)
        try:
            reply = b""
            error: TwinserveError | None = None
            try:
                if refusal is not None:
                    message.id = self.codec.message_id(data)
                    raise refusal
                reply = await drive.ainfer_decoded_first(
                    message, _Message.decode, _Message.opened, _Message.admit, _Message.predict, _Message.encode
                )
            except MessageError as exc:  # a message the codec refused: it fails before it is admitted
                message.id, error = exc.id, exc.error
                message.opened().failed(error)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = message.opened().failed(exc)
            exchange = message.opened()
            if error is not None:
                write_error = self.codec.binary_error if binary else self.codec.text_error
                reply = write_error(message.id, error, exchange.request_id)
            else:
                exchange.responded(200)
            await self._send(reply, binary)
        except asyncio.CancelledError:
            message.opened().failed(ClientDisconnected("the WebSocket closed before the answer was ready"))
            raise
        finally:
            message.opened().close()

    async def _send(self, reply: bytes, binary: bool) -> None:
        if self.closed:
            return
        message: dict[str, Any] = {"type": "websocket.send"}
        if binary:
            message["bytes"] = reply
        else:
            message["text"] = reply.decode()
        try:
            async with asyncio.timeout(self.write_deadline):  # no task of its own: the answer is done when sent
                await self.websocket.send(message)
        except (WebSocketDisconnect, WebSocketDisconnected):
            self.closed = True
        except TimeoutError:
            # The client reads nothing: its answers would pile up in the server for as long as it stays connected.
            self.closed = self._close_sent = self._stalled = True
            logger.info(
                "WebSocket client on %s read nothing for %g s (--read-timeout-s): cut off",
                self.path,
                self.write_deadline,
            )
            if self._reader is not None:
                self._reader.cancel()


class _Message:
    """One message of a socket on its way through its steps (service/drive.py `ainfer_decoded_first`, whose
    `source` it is): what the steps learn of it (its id, a binary message's V2 request) and the exchange they open,
    which the socket fails and closes."""

    __slots__ = ("data", "exchange", "framed", "id", "received", "socket")

    def __init__(self, socket: _Socket, data: str | bytes) -> None:
        self.socket = socket
        self.data = data
        self.received = time.perf_counter()
        self.id: str | None = None
        #: A binary message as decoded (framed V2); None for a text message (V1), or before it is decoded.
        self.framed: BinaryMessage | None = None
        self.exchange: Exchange | None = None

    async def decode(self) -> list[Any]:
        """Its instances, decoded before its exchange opens: the message's id, its request id, is inside it."""
        codec, data = self.socket.codec, self.data
        if isinstance(data, str):
            text = await decode_off_loop(codec.decode_text, data)
            self.id = text.id
            return text.instances
        framed = self.framed = await decode_off_loop(codec.decode_binary, data)
        self.id = framed.id
        return framed.request.instances

    def opened(self) -> Exchange:
        """Its exchange, opened now unless a step opened it already (a message refused unread, or by its codec)."""
        if self.exchange is None:
            socket = self.socket
            exchange = Exchange.open(
                socket.service, ENDPOINT, "WS", socket.path, None, self.id, model=socket.runtime.name
            )
            exchange.context.started = self.received  # decoding counts, as it does for an HTTP request
            exchange.key_id = socket.key_id  # the handshake's key: its priority level holds for every message
            self.exchange = exchange
        return self.exchange

    def admit(self, exchange: Exchange) -> ModelRuntime:
        """A message is admitted like an HTTP request, and charged to the API key its handshake presented; the
        runtime that computes it is its model's default now (a repository load may have replaced the handshake's,
        and an unload drains the messages inside it). A V2 frame's own timeout then tightens its deadline."""
        socket = self.socket
        if socket.key_id is not None:
            socket.service.admission.charge(socket.key_id)
        runtime = exchange.admit(socket.head)
        if self.framed is not None:
            exchange.deadline = socket.service.admission.tighten(exchange.deadline, self.framed.request.timeout_us)
        return runtime

    def predict(self, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Awaitable[list[Any]]:
        """Its outputs, from the model's batcher; cancelled from the queue once the socket can take no answer."""
        return runtime.apredict(instances, deadline, self.socket.gone)

    def encode(self, exchange: Exchange, outputs: Any) -> bytes:
        """Its answer, in the form it came in: V1 text, or a framed V2 binary message."""
        codec = self.socket.codec
        if self.framed is None:
            return codec.encode_text(self.id, outputs, exchange.instances)
        return codec.encode_binary(self.framed.request, outputs)


def _size(data: str | bytes, limit: int) -> int:
    """The message's size in bytes (a text's UTF-8 length is only computed when it could matter)."""
    size = len(data)
    if isinstance(data, str) and size * 4 > limit and not data.isascii():
        size = len(data.encode())
    return size


async def deny_handshake(websocket: WebSocket, service: Service, error: TwinserveError) -> None:
    """Refuse the handshake with the HTTP contract's status and body (or close 1008 without that extension)."""
    model = websocket.path_params.get("model", "")
    path = websocket.scope["path"]
    exchange = Exchange.open(
        service, ENDPOINT, "WS", path, websocket.headers, None, model=model, shape=error_shape(path)
    )
    try:
        reply = exchange.fail(error)
        if _DENIAL_EXTENSION in websocket.scope.get("extensions", {}):
            # What starlette's `send_denial_response` does with a `Response`: the reply as `websocket.http.*`.
            await AsgiReply(reply, exchange.request_id)(websocket.scope, websocket.receive, websocket.send)
        else:
            await websocket.close(CLOSE_POLICY, error.message[:120])
    finally:
        exchange.close()


def websocket_endpoint(service: Service, sockets: OpenSockets) -> Callable[[WebSocket], Awaitable[None]]:
    """The WebSocket endpoint of `/v1/models/{model}/ws` over `service`; open sockets are kept in `sockets`."""
    codecs: dict[str, WebSocketCodec] = {}

    async def endpoint(websocket: WebSocket) -> None:
        key_id: str | None = None
        try:
            # Browsers let any page open a WebSocket anywhere, without a preflight, but always send its Origin: a
            # page from a foreign origin may not open one (cross-site WebSocket hijacking), with or without CORS.
            # The key, when required, comes with the handshake.
            headers = websocket.headers
            origin = headers.get("origin")
            if origin is not None and not service.origin_allowed(origin, headers.get("host")):
                raise CorsRejected(
                    f"origin {origin[:100]!r} may not open a WebSocket here (--cors-origins, --allowed-hosts)"
                )
            if service.requires_auth(websocket.scope["path"]):
                client = websocket.scope.get("client")
                key_id = service.authenticate(headers, client[0] if client else None)
            if sockets.closing:
                raise ShuttingDown("the server is shutting down", headers={"Retry-After": "1"})
            peer = websocket.scope.get("client")
            client = service.forwarded.client(peer[0] if peer else None, headers.get("x-forwarded-for")) or ""
            if sockets.of(client) >= service.config.ws_max_per_client:
                raise RateLimited(
                    f"this address holds {service.config.ws_max_per_client} open WebSockets here "
                    "(--ws-max-per-client): close one first",
                    headers={"Retry-After": "1"},
                )
            runtime = admit_socket(service, websocket.path_params["model"])
        except TwinserveError as exc:
            await deny_handshake(websocket, service, exc)
            return
        codec = codecs.get(runtime.name)
        if codec is None:
            codec = codecs[runtime.name] = WebSocketCodec(
                runtime.spec.input_type,
                service.codecs_of(runtime).v1,
                service.codecs_of(runtime).v2,
                service.config.max_instances,
            )
        socket = _Socket(websocket, service, runtime, codec, key_id, client)
        sockets.add(socket)  # before accept: a shutdown signal during the handshake drains this socket too
        try:
            await websocket.accept()
            await socket.serve()
        finally:
            sockets.discard(socket)

    return endpoint
