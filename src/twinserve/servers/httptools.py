"""uvicorn's httptools protocol, guarded: limits on a request's head (414, 431) and on how long it may take, and
twinserve's JSON error body for every request its parser refuses (400 `malformed_http`).

All are what gunicorn's parser and twinserve's gunicorn workers enforce for the sync architecture, so the same
abusive client meets the same answer in every architecture. The protocol also publishes, as an ASGI extension,
whether each request's client has gone (`DISCONNECT_EXTENSION`), so the front never reads uvicorn's private state.

A predict request for a model whose queue is full is refused here, from its head, when the app has published its
`EarlyRefusal` (fronts/early.py) in the lifespan state: the app's 503 is written at once, the body is read and
discarded as it arrives, and the connection stays open for the next request (RFC 9112 section 9.3: a server that
answers before the whole request has arrived either reads the rest or closes; closing with unread bytes in the
socket would reset the connection and could lose the answer). No ASGI task is made and the app never runs.

A kept-alive connection answered (served or refused) while its last request's model could not take another at its
level is not read again until that model's queue takes the level, or the level's wait has passed
(servers/holding.py): a crowd's next requests wait in TCP instead of being read and refused.
"""

from __future__ import annotations

import asyncio
import functools
import os
import weakref
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from twinserve.config import Config
from twinserve.errors import HeadersTooLarge, MalformedHttp, TwinserveError, UriTooLong
from twinserve.fronts.contract import raw_error_response
from twinserve.fronts.disconnect import DISCONNECT_EXTENSION
from twinserve.fronts.early import EARLY_REFUSAL_STATE, EarlyRefusal
from twinserve.servers.holding import ReadHolds

__all__ = ["CONFIG_ENV", "GuardedHttpToolsProtocol"]

#: uvicorn's worker processes are spawned, not forked: they rebuild the Config from this variable.
CONFIG_ENV = "TWINSERVE_SERVE_CONFIG_JSON"


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request past a limit."""


@functools.cache
def _config() -> Config:
    return Config.model_validate_json(os.environ[CONFIG_ENV])


_read_holds: ReadHolds | None = None


def _holds(loop: asyncio.AbstractEventLoop, config: Config) -> ReadHolds:
    """The held connections of `loop`, the server's (one per uvicorn worker process; a server started again in
    the same process, as tests do, gets its own)."""
    global _read_holds
    if _read_holds is None or _read_holds.loop is not loop:
        _read_holds = ReadHolds(loop, config.priority_levels)
    return _read_holds


def _disconnected(cycle: RequestResponseCycle) -> Callable[[], bool]:
    """Whether `cycle`'s client has gone, asked without holding the cycle: the scope that carries this function is
    the cycle's own, and a strong reference back would make every request's objects a reference cycle, freed only
    by the garbage collector's full passes (measured: a pause of 50-120 ms every second or so under load)."""
    ref = weakref.ref(cycle)

    def disconnected() -> bool:
        live = ref()
        return live is None or live.disconnected  # a cycle no longer alive has finished: nobody waits on it

    return disconnected


def _arrived_body(cycle: RequestResponseCycle) -> Callable[[], bytes | None]:
    """The request's whole body if it has all arrived and the app has not read any of it yet, taken as uvicorn's
    `receive` would take it; else None (the app then reads it through `receive`, under its read deadline).

    Most predict requests arrive whole in one read, before the app's task first runs: taking the body here spares
    each of them an `asyncio.timeout` and starlette's body stream (measured: about 16% less server CPU per request
    for a trivial model; docs/internals.md). A body that waits on `Expect: 100-continue` is never taken here:
    `receive` answers the 100."""
    ref = weakref.ref(cycle)

    def arrived() -> bytes | None:
        live = ref()
        if (
            live is None
            or live.more_body
            or live.disconnected
            or live.response_complete
            or live.waiting_for_100_continue
            or not live.message_event.is_set()
        ):
            return None
        live.flow.resume_reading()  # as `receive` does: a large body may have paused reading
        live.message_event.clear()
        body, live.body = bytes(live.body), bytearray()
        return body

    return arrived


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request-line and header limits gunicorn enforces (414, 431), and a
    bound on how long a request's head may take to arrive; each request's scope says whether its client has gone
    (`DISCONNECT_EXTENSION`: the cycle's own flag, set when the connection is lost).

    llhttp sets no limit of its own, and httptools buffers a header until it is complete, so without these a
    client could send one header without end. The bytes of a request's head are therefore bounded as they arrive:
    the whole head may not exceed the request line plus the header fields allowed, each at its longest.
    uvicorn times out idle kept-alive connections but not a client that sends its request line and headers a byte
    at a time (slowloris): such a connection is closed after `--read-timeout-s`. A slow body is the front's to
    bound (it answers 408). Anything else llhttp cannot parse (a request line, a header, conflicting
    Content-Length and Transfer-Encoding, a bad chunk) gets 400 `malformed_http` instead of uvicorn's plain text.
    """

    _head_timer: asyncio.TimerHandle | None = None
    #: When the running read deadline began (a request's first byte, or a refused request's head), while no timer
    #: is armed for it: `data_received` arms one only if the head or the discarded body is still incomplete
    #: after the read, so the common request, whole in one read, costs no timer.
    _clock_from: float | None = None

    #: Whether this connection's reading is paused by `ReadHolds` (servers/holding.py), its next request unread.
    _held = False
    #: Whether the request just refused early may leave the connection held, once its bytes are all parsed.
    _hold_check = False
    #: Whether a request is being parsed (from its first byte to its last): a connection is held only between.
    _in_request = False
    #: Whether the connection closes after its next answer (a held one, read again because the server stops).
    _last_answer = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = _config()
        self._read_timeout = config.read_timeout_s
        self._max_line = config.max_request_line
        self._max_count = config.max_header_count
        self._max_field = config.max_header_bytes
        self._max_head = config.max_request_line + config.max_header_count * (config.max_header_bytes + 2)
        self._head_bytes = 0
        self._header_count = 0
        self._in_head = True
        self._refusal: TwinserveError | None = None
        early: EarlyRefusal | None = self.app_state.get(EARLY_REFUSAL_STATE)
        self._early = early if early is not None and early.active else None
        self._holds = _holds(self.loop, config) if self._early is not None and config.max_queue_wait_ms else None
        #: Whether the request being parsed was refused early: its body is discarded, the app never sees it.
        self._discarding = False
        #: Whether the connection stays open after that refusal.
        self._keep_alive = True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._unhold()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._held:  # its next request is read, and answered with `connection: close`
            self._unhold()
            self._last_answer = True
            self.release_hold()
            return
        super().shutdown()

    def data_received(self, data: bytes) -> None:
        counting = self._in_head
        super().data_received(data)
        # Counted after parsing, so a chunk that ends the head and carries a large body is not held against it;
        # what httptools buffers stays bounded by the limit plus one read.
        if counting and self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head:
                self._refuse(HeadersTooLarge())
        if self._clock_from is not None and self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_at(self._clock_from + self._read_timeout, self._head_timed_out)
        if self._hold_check:  # a request refused early: its bytes, and any after it in this read, are parsed
            self._hold_check = False
            self._hold_if_crowded()

    def on_message_begin(self) -> None:
        self._unset_keepalive_if_required()  # a request after an early refusal, in the same read
        self._in_request = True
        super().on_message_begin()
        self._header_count = 0
        if self._head_timer is None:  # else the connection's own deadline, from before its first byte, holds
            self._clock_from = self.loop.time()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self._max_line:
            self._refusal = UriTooLong()
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._max_count or len(name) + len(value) + 2 > self._max_field:
            self._refusal = HeadersTooLarge()
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if self._early is not None and self._refused_early():
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # this request's cycle (not an upgrade's)
            if self._last_answer:
                cycle.keep_alive = False
            # The app's task, created above, first runs on the loop's next turn: the scope is complete by then.
            extensions = cast(dict[str, Any], self.scope).setdefault("extensions", {})
            extensions[DISCONNECT_EXTENSION] = {"disconnected": _disconnected(cycle), "body": _arrived_body(cycle)}

    def on_body(self, body: bytes) -> None:
        if not self._discarding:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_request = False
        if self._discarding:
            self._refusal_complete()
        else:
            super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def _refused_early(self) -> bool:
        """Answer the request whose head was just parsed with the app's 503, if `EarlyRefusal` says so. Only on
        a connection with nothing else in progress (a pipelined request's answer must wait for the one before
        it), whose client reads its answers (else the server's own backpressure applies), and not an upgrade."""
        cycle, parser = self.cycle, self.parser
        if (cycle is not None and not cycle.response_complete) or self.pipeline or self.flow.write_paused:
            return False
        if parser.should_upgrade():
            return False
        assert self._early is not None
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive() and not self._last_answer
        answer = self._early.refuse(
            parser.get_method(), self.url, self.headers, self.server_state.default_headers, keep_alive
        )
        if answer is None:
            return False
        self.transport.write(answer)
        self._discarding, self._keep_alive = True, keep_alive
        self._clock_from = self.loop.time()  # the body it discards gets --read-timeout-s too, as the front gives it
        return True

    def _refusal_complete(self) -> None:
        """The refused request's body has been read: close, or wait for the next request as after any answer."""
        self._discarding = False
        self._cancel_head_timer()
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if not self._keep_alive:
            self.transport.close()
            return
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
        self._hold_check = self._holds is not None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._hold_if_crowded()

    def _hold_if_crowded(self) -> None:
        """Pause reading this kept-alive connection, just answered, if its last request's model could not take its
        next request at the same level now (servers/holding.py): that request waits unread in TCP, costing no
        CPU, instead of being read and refused. Not while a request is being parsed or waits in the pipeline."""
        if self._holds is None or self._held or self._in_request or self.pipeline or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return
        assert self._early is not None
        target = self._early.hold(self.parser.get_method(), self.url, self.headers)
        if target is None:
            return
        runtime, level, wait = target
        self._unset_keepalive_if_required()  # held, it is not idle: its keep-alive runs again once read
        self.flow.pause_reading()
        self._held = True
        self._holds.hold(self, runtime, level, wait)

    def release_hold(self) -> None:
        self._held = False
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _unhold(self) -> None:
        if self._held and self._holds is not None:
            self._holds.forget(self)
            self._held = False

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error, ours included, with this 400; a refusal gets its own status.
        self._refuse(self._refusal or MalformedHttp())

    def _refuse(self, error: TwinserveError) -> None:
        if self.transport.is_closing():
            return
        # A body can turn out malformed after the app has begun its answer (one that did not wait for the body):
        # a second response on the wire would be taken for the next one's, so the connection just closes.
        if self._in_head or self.cycle is None or not self.cycle.response_started:
            self.transport.write(raw_error_response(error))
        self.transport.close()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._read_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        self._clock_from = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()
