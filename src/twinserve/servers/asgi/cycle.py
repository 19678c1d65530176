"""One request and its response on a connection of the async server (servers/asgi/protocol.py): the ASGI app's
`receive` and `send`, and what the app's task does when the app fails.

The cycle holds no reference to its scope: the scope carries the cycle's own `gone` and `arrived_body`
(`DISCONNECT_EXTENSION`), and a reference back would make every request's objects a reference cycle, freed only by
the garbage collector's full passes (measured under uvicorn's cycle: a pause of 50-120 ms every second or so under
load). The cycle lets go of its connection when the app's task ends, for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any, Protocol

from uvicorn.server import ServerState

__all__ = ["Connection", "Cycle"]

logger = logging.getLogger("uvicorn.error")

#: Each status's line, as written (the reason phrase is HTTP/1.1's own; an unknown status has none).
_STATUS_LINES = {
    code: f"HTTP/1.1 {code} {HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else ''}\r\n".encode()
    for code in range(100, 600)
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
#: A body shorter than this is copied after the head, for one write; a longer one goes beside it (`writelines`).
_JOIN_BELOW = 16384
_DISCONNECT = {"type": "http.disconnect"}
_INTERNAL_ERROR_HEAD = {
    "type": "http.response.start",
    "status": 500,
    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")],
}
_INTERNAL_ERROR_BODY = {"type": "http.response.body", "body": b"Internal Server Error"}


class Connection(Protocol):
    """What a cycle needs of its connection (servers/asgi/protocol.py `Connection`)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    server_state: ServerState
    write_paused: bool

    async def drain(self) -> None: ...

    def resume_reading(self) -> None: ...

    def response_complete(self, cycle: Cycle) -> None: ...


class Cycle:
    """One request's body as it arrives, and its response as the app sends it (HTTP/1.1, RFC 9112)."""

    __slots__ = (
        "__weakref__",
        "body",
        "body_done",
        "chunked",
        "complete",
        "conn",
        "disconnected",
        "expect_continue",
        "head_request",
        "keep_alive",
        "more_body",
        "pending",
        "remaining",
        "started",
        "waiter",
    )

    def __init__(self, conn: Connection, head_request: bool, keep_alive: bool, expect_continue: bool) -> None:
        #: The connection, until the app's task ends.
        self.conn: Connection | None = conn
        self.head_request = head_request
        self.keep_alive = keep_alive
        #: `Expect: 100-continue`, not yet answered: the app's first `receive` sends the `100 Continue`.
        self.expect_continue = expect_continue
        #: What has arrived of the body and the app has not taken (bytes as llhttp gives it; a bytearray once
        #: a second chunk joins the first).
        self.body: bytes | bytearray = b""
        self.more_body = True
        #: The app has been given the body's end.
        self.body_done = False
        self.disconnected = False
        self.started = False
        self.complete = False
        self.chunked = False
        #: The bytes still owed by a response of declared `Content-Length`.
        self.remaining = 0
        #: The response's head, not written yet: it goes out with the first part of the body, in one write (one
        #: system call, not two), or on the loop's next turn if the app sends none by then (a stream's first event
        #: may take long).
        self.pending: bytes | None = None
        #: What `receive` awaits while nothing has arrived.
        self.waiter: asyncio.Future[None] | None = None

    # -- fed by the connection ---------------------------------------------------------------------------------
    def add(self, chunk: bytes) -> int:
        """Add a chunk of the body; how many bytes wait now."""
        body = self.body
        if not body:
            self.body = chunk
        elif isinstance(body, bytes):
            self.body = bytearray(body) + chunk
        else:
            body += chunk
        self.wake()
        return len(self.body)

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- what the scope publishes (DISCONNECT_EXTENSION) -------------------------------------------------------
    def gone(self) -> bool:
        """Whether the client has gone before the response was complete."""
        return self.disconnected

    def arrived_body(self) -> bytes | None:
        """The whole body if it has all arrived and the app has read none of it, taken as `receive` would take it;
        else None (the app then reads it through `receive`, under its read deadline). A body that waits on
        `Expect: 100-continue` is never taken here: `receive` answers the 100.

        Most predict requests arrive whole in one read, before the app's task first runs: taking the body here
        spares each of them an `asyncio.timeout` and starlette's body stream (measured: about 16% less server CPU
        per request for a trivial model; docs/internals.md)."""
        if self.more_body or self.body_done or self.disconnected or self.complete or self.expect_continue:
            return None
        body, self.body, self.body_done = self.body, b"", True
        if self.conn is not None:
            self.conn.resume_reading()  # a large body may have paused reading
        return bytes(body) if isinstance(body, bytearray) else body

    # -- the app's task ----------------------------------------------------------------------------------------
    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        try:
            result = await app(scope, self.receive, self.send)
        except BaseException as exc:  # as uvicorn's cycles do: whatever ends the app, the client gets an end
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.started:
                await self._internal_error()
            else:
                self._close()
        else:
            if result is not None:
                logger.error("ASGI callable should return None, but returned '%s'.", result)
                self._close()
            elif not self.started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self._internal_error()
            elif not self.complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.conn = None

    async def _internal_error(self) -> None:
        await self.send(_INTERNAL_ERROR_HEAD)
        await self.send(_INTERNAL_ERROR_BODY)

    def _close(self) -> None:
        self.flush()
        if self.conn is not None:
            self.conn.transport.close()

    def flush(self) -> None:
        """Write the response's head if it waits still."""
        head, self.pending = self.pending, None
        if head is not None and self.conn is not None and not self.conn.transport.is_closing():
            self.conn.transport.write(head)

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.pending is not None:
            self.flush()  # the app reads on after its answer's start: the client may wait for it
        if self.expect_continue:
            self.expect_continue = False
            if conn is not None and not conn.transport.is_closing():
                conn.transport.write(_CONTINUE)
        while not (self.disconnected or self.complete or self.body or (not self.more_body and not self.body_done)):
            if conn is None:
                return _DISCONNECT.copy()
            conn.resume_reading()
            self.waiter = conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if self.disconnected or self.complete:
            return _DISCONNECT.copy()
        body, self.body = self.body, b""
        if not self.more_body:
            self.body_done = True
        return {
            "type": "http.request",
            "body": bytes(body) if isinstance(body, bytearray) else body,
            "more_body": self.more_body,
        }

    async def send(self, message: Any) -> None:
        conn = self.conn
        if conn is None:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after the app returned.")
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected or conn.transport.is_closing():
            self.disconnected = True  # closed by the server (a parser's refusal): the client gets nothing more
            return
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            head = self._head(message["status"], message.get("headers", ()), conn)
            self.started = True
            self.expect_continue = False
            self.pending = head
            conn.loop.call_soon(self.flush)
        elif not self.complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.head_request:
                data = b""  # a HEAD answer's head says what a GET's body would be, and no body follows
            elif self.chunked:
                if body:
                    data = b"%x\r\n%b\r\n%b" % (len(body), body, b"" if more_body else _LAST_CHUNK)
                else:
                    data = b"" if more_body else _LAST_CHUNK
            else:
                if len(body) > self.remaining:
                    raise RuntimeError("Response content longer than Content-Length")
                self.remaining -= len(body)
                data = body
            pending, self.pending = self.pending, None
            if pending is None:
                if data:
                    conn.transport.write(data)
            elif len(data) < _JOIN_BELOW:
                conn.transport.write(pending + data)
            else:
                conn.transport.writelines((pending, data))
            if not more_body:
                if self.remaining and not self.head_request:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.complete = True
                self.wake()
                if not self.keep_alive:
                    conn.transport.close()
                conn.response_complete(self)
        else:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")

    def _head(self, status: int, headers: Any, conn: Connection) -> bytes:
        """The response's head: the status line, the server's own headers, the app's (names lower-cased), then
        `connection: close` and `transfer-encoding: chunked` where the server decides them."""
        parts = [_STATUS_LINES[status]]
        lines = 2  # the status line and the empty one
        for name, value in conn.server_state.default_headers:
            parts += (name, b": ", value, b"\r\n")
            lines += 1
        length: int | None = None
        chunked = close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                if length is None:
                    length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.lower() == b"chunked"
            elif name == b"connection":
                close = b"close" in [token.strip().lower() for token in value.split(b",")]
            parts += (name, b": ", value, b"\r\n")
            lines += 1
        keep_alive = self.keep_alive and not close
        if not keep_alive and not close:
            parts.append(b"connection: close\r\n")
            lines += 1
        remaining = 0
        if length is not None and not chunked:
            remaining = length
        elif not chunked and not self.head_request and status not in (204, 304):
            # No length declared: the body's end is its last chunk (RFC 9112 section 7.1).
            chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
            lines += 1
        parts.append(b"\r\n")
        head = b"".join(parts)
        # A CR or LF inside a name or value would split the response (a header injected, or a body): each line has
        # exactly one of each, at its end.
        if head.count(b"\n") != lines or head.count(b"\r") != lines:
            raise RuntimeError("Invalid HTTP header name or value.")
        self.keep_alive, self.chunked, self.remaining = keep_alive, chunked, remaining
        return head
