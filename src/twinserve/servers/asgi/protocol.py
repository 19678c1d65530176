"""twinserve's HTTP/1.1 protocol for uvicorn: an `asyncio.Protocol` on httptools that uvicorn instantiates through
`uvicorn.Config(http=...)`, one per connection, and runs the ASGI app for each request (servers/asgi/cycle.py).

What it takes from uvicorn is what uvicorn hands every HTTP protocol: the keyword arguments `config`,
`server_state` and `app_state` (the lifespan's state, handed on in each request's scope); `server_state.connections`
(each connection registers itself; uvicorn's graceful stop calls `shutdown()` on each, then waits until none is
left), `server_state.tasks` (each app task, awaited or cancelled at the stop), `server_state.total_requests` and
`server_state.default_headers` (`date`, `server`, renewed each second). From `config`: the app (`loaded_app`),
`root_path`, `timeout_keep_alive`, `limit_concurrency` (past it, 503 as uvicorn answers) and `ws_protocol_class`, to
which a WebSocket handshake's connection is handed as uvicorn's own HTTP protocols hand it. From twinserve's server,
the keyword argument `served` (servers/served.py): the Config it serves and the refusal before the app.

Its own, the same as twinserve's sync worker enforces (servers/http1.py): the request-line and header limits (414,
431), and 400 `malformed_http` with twinserve's JSON body for anything llhttp refuses; a bound on how long a request's
head may take to arrive (`--read-timeout-s`: a client that sends its head a byte at a time is closed), whereas a slow
body is the front's to bound (it answers 408). Each request's scope publishes, as an ASGI extension, whether its
client has gone and its body if it has all arrived (`DISCONNECT_EXTENSION`). Early refusals from the head and held
connections are servers/asgi/crowd.py's.

One timer per connection at most, armed lazily: a deadline is a float set as the connection's state changes
(idle, reading a head, discarding a refused body) and the timer, when it fires early, re-arms for it; a request whose
head arrives whole in one read costs no timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, cast
from urllib.parse import unquote

import httptools
import uvicorn
from uvicorn.server import ServerState

from twinserve.errors import TwinserveError
from twinserve.fronts.disconnect import DISCONNECT_EXTENSION
from twinserve.servers.asgi.accept import accept_waiting
from twinserve.servers.asgi.crowd import Crowd
from twinserve.servers.asgi.cycle import Cycle
from twinserve.servers.http1 import HeadReader, Limits, ParseError
from twinserve.servers.served import Served
from twinserve.service.contract import raw_error_response
from twinserve.service.lifecycle import DECIDED

__all__ = ["HIGH_WATER", "HttpProtocol"]

logger = logging.getLogger("uvicorn.error")

#: Bytes of a request's body waiting for the app past which the connection is not read until the app takes them.
HIGH_WATER = 65536
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_EXPECT_CONTINUE = (b"expect", b"100-continue")


async def _unavailable(scope: Any, receive: Any, send: Any) -> None:
    """The answer past `limit_concurrency`, uvicorn's own."""
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"19"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"Service Unavailable"})


def _address(info: Any) -> tuple[str, int] | None:
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) and len(info) >= 2 else None


class HttpProtocol(HeadReader, asyncio.Protocol):
    """One HTTP/1.1 connection under uvicorn (see the module), of the server whose process `served` describes: its
    Config, and the refusal before the app that the app built in this process (servers/served.py). uvicorn is given
    `functools.partial(HttpProtocol, served=...)` and adds its own keyword arguments."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        served: Served,
    ) -> None:
        settings = served.config
        super().__init__(Limits.of(settings))
        if not config.loaded:
            config.load()
        self.config = config
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        #: uvicorn's set of open connections, typed there with its own protocols only.
        self.connections: set[Any] = server_state.connections
        self.app_state = app_state
        self.served = served
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self._root = config.root_path
        self._raw_root = config.root_path.encode("ascii")
        self.keep_alive_s = float(config.timeout_keep_alive)
        self._limit = config.limit_concurrency
        self.read_timeout = settings.read_timeout_s
        self._server: tuple[str, int] | None = None
        self._client: tuple[str, int] | None = None
        self._scheme = "http"
        #: The request whose response runs (or ran last), the one whose body is being read, those read behind it.
        self._cycle: Cycle | None = None
        self._parsing: Cycle | None = None
        self._queue: deque[tuple[Cycle, Any, dict[str, Any]]] = deque()
        self._read_paused = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        #: When the connection is closed unless its state changes first; the timer armed for it, and when.
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        #: Whether no request has begun yet: the deadline from the connection's start holds for its first head.
        self._fresh = True
        #: Whether the request being parsed is a WebSocket handshake, handed to uvicorn's WebSocket protocol.
        self._websocket = False
        #: Whether what follows is another protocol's (an upgrade twinserve does not speak): never read as HTTP.
        self._ignoring = False
        #: The answer to a request the parser refused, owed once the requests read before it are answered.
        self._owed: bytes | None = None
        #: Whether the connection closes after its next answer (uvicorn's graceful stop, while it was held).
        self.last_answer = False
        self.crowd = Crowd.of(self, served.early, settings)

    # -- asyncio's callbacks -----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a stream's: it reads and writes
        self.connections.add(self)
        self.transport = transport
        self._server = _address(transport.get_extra_info("sockname"))
        self._client = _address(transport.get_extra_info("peername"))
        self._scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        self.set_deadline(self.loop.time() + self.read_timeout)
        accept_waiting(self.loop, self._sibling)  # the connections behind it in the accept queue (accept.py)

    def _sibling(self) -> HttpProtocol:
        """A protocol for another connection of the same server."""
        return HttpProtocol(self.config, self.server_state, self.app_state, self.loop, served=self.served)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.crowd is not None:
            self.crowd.close()
        for cycle in (self._cycle, self._parsing, *(queued for queued, _, _ in self._queue)):
            if cycle is not None and not cycle.complete:
                cycle.disconnected = True
                cycle.wake()
        self._queue.clear()
        self.resume_writing()
        if exc is None:
            self.transport.close()
        del self.parser  # it calls back into this protocol: without it, the two are no reference cycle

    def data_received(self, data: bytes) -> None:
        if self._ignoring:
            return
        try:
            switch = self.feed(data)
        except ParseError as refused:
            self._refuse(refused.error)
            return
        if switch is not None:
            self._switch(data, switch)
            return
        if self._deadline is not None:
            self._arm()
        if self.crowd is not None and self.crowd.hold_check:  # a request refused early: its bytes all parsed
            self.crowd.hold_check = False
            self.crowd.hold_if_crowded()

    def eof_received(self) -> None:
        pass  # the transport closes; a request being answered is marked gone then

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        """Return when the transport takes more (the client reads its answers again), or the connection is lost."""
        if self._drained is None or self._drained.done():  # (one a cancelled `send` left behind)
            self._drained = self.loop.create_future()
        await self._drained

    def shutdown(self) -> None:
        """uvicorn's graceful stop: close an idle connection; a request being answered ends with
        `connection: close`; a held one is read again and its next request answered so."""
        if self.crowd is not None and self.crowd.held:
            self.last_answer = True
            self.crowd.release()
            return
        cycle = self._cycle
        if cycle is None or cycle.complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    # -- llhttp's callbacks ------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._parsing = None
        if self._fresh:
            self._fresh = False  # the connection's own deadline, from before its first byte, holds
        else:
            self._deadline = self.loop.time() + self.read_timeout

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._deadline = None
        parser = self.parser
        if parser.should_upgrade() and self._is_websocket():
            self._websocket = True
            return
        crowd = self.crowd
        if crowd is not None and crowd.refused_early():
            return
        version = parser.get_http_version()
        method = parser.get_method()
        url = self.url
        raw_path, _, query = url.partition(b"?")
        if not raw_path.startswith(b"/") or b"#" in url:  # an absolute form, `*`, a fragment: llhttp's URL parser
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path or b"", parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        headers = self.headers
        cycle = Cycle(
            self,
            method == b"HEAD",
            version != "1.0" and parser.should_keep_alive() and not self.last_answer,
            _EXPECT_CONTINUE in headers,
        )
        extensions: dict[str, object] = {DISCONNECT_EXTENSION: {"disconnected": cycle.gone, "body": cycle.arrived_body}}
        if crowd is not None and crowd.decided is not None:  # let in from its head: the app does not decide again
            extensions[DECIDED] = crowd.decided
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self._server,
            "client": self._client,
            "scheme": self._scheme,
            "method": method.decode("ascii"),
            "root_path": self._root,
            "path": self._root + path if self._root else path,
            "raw_path": self._raw_root + raw_path if self._root else raw_path,
            "query_string": query,
            "headers": headers,
            "state": self.app_state.copy(),
            "extensions": extensions,
        }
        app = self.app
        limit = self._limit
        if limit is not None and (len(self.connections) >= limit or len(self.server_state.tasks) >= limit):
            logger.warning("Exceeded concurrency limit.")
            app = _unavailable
        self._parsing = cycle
        running = self._cycle
        if running is None or (running.complete and not self._queue):
            self._start(cycle, app, scope)
        else:  # pipelined: answered in order, after the ones before it; nothing more is read meanwhile
            self._queue.append((cycle, app, scope))
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self._parsing
        if cycle is None or cycle.complete or (self.crowd is not None and self.crowd.discarding):
            return
        if cycle.add(body) > HIGH_WATER:
            self.pause_reading()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.crowd is not None and self.crowd.discarding:
            self.crowd.refusal_complete()
            return
        cycle = self._parsing
        if cycle is None:
            return
        cycle.more_body = False
        cycle.wake()
        if cycle.complete and cycle is self._cycle and not self._queue and not self.transport.is_closing():
            self.set_deadline(self.loop.time() + self.keep_alive_s)  # answered before its body ended: idle now

    # -- requests ----------------------------------------------------------------------------------------------
    def _start(self, cycle: Cycle, app: Any, scope: dict[str, Any]) -> None:
        self._cycle = cycle
        tasks = self.server_state.tasks
        task = self.loop.create_task(cycle.run(app, scope))
        task.add_done_callback(tasks.discard)
        tasks.add(task)

    def response_complete(self, cycle: Cycle) -> None:
        """`cycle`'s response is written whole: the next request read behind it runs, or the connection idles."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self._owed is not None and not self._queue:  # a request the parser refused, after those before it
            self.transport.write(self._owed)
            self.transport.close()
            return
        if self._queue:
            self._start(*self._queue.popleft())
            if not self._queue:
                self.resume_reading()
            return
        self.resume_reading()
        if not self.started:  # no request being read: idle from now (else its body or head is still arriving)
            self.set_deadline(self.loop.time() + self.keep_alive_s)
        if self.crowd is not None:
            self.crowd.hold_if_crowded()

    def answering(self) -> bool:
        """Whether a request read is not answered yet (running, or waiting behind another)."""
        return bool(self._queue) or (self._cycle is not None and not self._cycle.complete)

    def busy(self) -> bool:
        """Whether a request is in progress: being read, answered, or waiting behind another."""
        return self.started or self.answering()

    # -- flow control and deadlines ----------------------------------------------------------------------------
    def pause_reading(self) -> None:
        if not self._read_paused and not self.transport.is_closing():
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again, unless the connection is held or requests wait behind the running one."""
        if self._read_paused and not self._queue and not (self.crowd is not None and self.crowd.held):
            self._read_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def set_deadline(self, at: float | None) -> None:
        """Close the connection at `at` unless its state changes first (None: no deadline)."""
        self._deadline = at
        if at is not None:
            self._arm()

    def _arm(self) -> None:
        deadline = self._deadline
        assert deadline is not None
        if self._timer is not None:
            if self._timer_at <= deadline:
                return  # it fires first, and re-arms
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._timed_out)

    def _timed_out(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self.transport.is_closing():
            return
        if deadline > self._timer_at:
            self._arm()
            return
        self.transport.close()  # an idle keep-alive, a head or a refused body not in by its deadline

    # -- the rest ----------------------------------------------------------------------------------------------
    def _is_websocket(self) -> bool:
        if self.config.ws_protocol_class is None:
            return False
        connection: list[bytes] = []
        upgrade = None
        for name, value in self.headers:
            if name == b"connection":
                connection = [token.strip().lower() for token in value.split(b",")]
            elif name == b"upgrade":
                upgrade = value.lower()
        return upgrade == b"websocket" and b"upgrade" in connection

    def _switch(self, data: bytes, offset: int) -> None:
        """Hand the connection to uvicorn's WebSocket protocol with the handshake's head (as uvicorn's own HTTP
        protocols do), or, for an upgrade twinserve does not speak, read nothing more as HTTP."""
        if not self._websocket:
            self._ignoring = True
            cycle = self._parsing
            if cycle is not None:
                cycle.keep_alive = False  # its answer ends the connection
                cycle.more_body = False
                cycle.wake()
            return
        self.connections.discard(self)
        self.set_deadline(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        head = [self.parser.get_method(), b" ", self.url, b" HTTP/1.1\r\n"]
        for name, value in self.headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        del self.parser  # nothing more is HTTP (and the parser calls back into this protocol: a reference cycle)
        ws_protocol_class: Any = self.config.ws_protocol_class
        protocol = ws_protocol_class(config=self.config, server_state=self.server_state, app_state=self.app_state)
        protocol.connection_made(self.transport)
        self.transport.set_protocol(protocol)
        protocol.data_received(b"".join(head) + data[offset:])

    def _refuse(self, error: TwinserveError) -> None:
        """Answer a request the parser refused, and close."""
        if self.transport.is_closing():
            return
        logger.debug("refused a request: %s", error.message)
        if self.crowd is not None and self.crowd.discarding:
            self.transport.close()  # a body being discarded: its request has its answer already
            return
        # A body can turn out malformed after the app has begun its answer (one that did not wait for the body):
        # a second response on the wire would be taken for the next one's, so the connection just closes.
        cycle = self._parsing
        if not self.in_head and cycle is not None:  # its body is broken: the app never gets the rest
            if cycle.started:
                self.transport.close()
                return
            if self._queue and self._queue[-1][0] is cycle:
                self._queue.pop()  # read behind another: never run
            elif cycle is self._cycle:
                self._answer_now(error)  # its app runs, and counts it (it reads the same error from its body)
                return
        # No app ever sees this one: counted here, once (`Service.unparsed`), as the sync worker counts it.
        if self.served.service is not None:
            self.served.service.unparsed(error)
        if self.answering():
            self._owed = raw_error_response(error)  # after the answers to the requests read before it (RFC 9112 9.3.2)
            self._ignoring = True
            self.pause_reading()
            return
        self._answer_now(error)

    def _answer_now(self, error: TwinserveError) -> None:
        self.transport.write(raw_error_response(error))
        self.transport.close()
