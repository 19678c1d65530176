"""A connection's part in a crowd: requests refused from their head, and connections held unread while their model
is full.

A predict request for a model whose queue is full is refused from its head where the server made an active
`EarlyRefusal` (fronts/early.py) over the app's service and handed it to its protocol (servers/served.py): the app's
503 is written at once, the body is read and discarded as it arrives, and the connection stays open for the next
request (RFC 9112 section 9.3: a server that answers before the whole request has arrived either reads the rest or
closes; closing with unread bytes in the socket would reset the connection and could lose the answer). No ASGI task
is made and the app never runs. A request let in from its head instead carries that decision to the app (`decided`,
published in the scope by the protocol): the app does not decide it again.

A kept-alive connection answered (served or refused) while its last request's model could not take another at its
level is not read again until that model's queue takes the level, or the level's wait has passed
(servers/holding.py): a crowd's next requests wait in TCP instead of being read and refused.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import httptools
from uvicorn.server import ServerState

from twinserve.config import Config
from twinserve.fronts.early import EarlyRefusal, Refusal
from twinserve.servers.holding import ReadHolds
from twinserve.service.lifecycle import Decided

__all__ = ["Crowd", "Reading"]

_read_holds: ReadHolds | None = None


def _holds(loop: asyncio.AbstractEventLoop, config: Config) -> ReadHolds:
    """The held connections of `loop`, the server's (one per uvicorn worker process; a server started again in
    the same process, as tests do, gets its own)."""
    global _read_holds
    if _read_holds is None or _read_holds.loop is not loop:
        _read_holds = ReadHolds(loop, config.priority_levels)
    return _read_holds


class Reading(Protocol):
    """What a crowd needs of its connection (servers/asgi/protocol.py `Reading`): the request last parsed, and
    the connection's state, deadline and reading."""

    parser: httptools.HttpRequestParser
    url: bytes
    headers: list[tuple[bytes, bytes]]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    server_state: ServerState
    write_paused: bool
    last_answer: bool
    read_timeout: float
    keep_alive_s: float

    def answering(self) -> bool: ...

    def busy(self) -> bool: ...

    def set_deadline(self, at: float | None) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Crowd:
    """One connection's early refusals and holds (see the module). `ReadHolds` holds the crowd, not the connection:
    the connection lets go of it when lost (`close`), so the two are no reference cycle."""

    __slots__ = ("_early", "_holds", "_keep_alive", "conn", "decided", "discarding", "held", "hold_check")

    def __init__(self, conn: Reading, early: EarlyRefusal, holds: ReadHolds | None) -> None:
        self.conn: Reading | None = conn
        self._early = early
        self._holds = holds
        #: Whether the request being parsed was refused early: its body is discarded, the app never sees it.
        self.discarding = False
        #: The request just parsed, let in from its head: what was decided, for the app to take as made.
        self.decided: Decided | None = None
        #: Whether the connection stays open after that refusal.
        self._keep_alive = True
        #: Whether the request just refused may leave the connection held, once the bytes of its read are parsed.
        self.hold_check = False
        #: Whether the connection's reading is paused by `ReadHolds`, its next request unread.
        self.held = False

    @classmethod
    def of(cls, conn: Reading, early: EarlyRefusal | None, config: Config) -> Crowd | None:
        """`conn`'s, where the app made an active `EarlyRefusal`; else None (nothing to refuse or hold)."""
        if early is None or not early.active:
            return None
        return cls(conn, early, _holds(conn.loop, config) if config.max_queue_wait_ms else None)

    def refused_early(self) -> bool:
        """Answer the request whose head was just parsed with the app's 503, if `EarlyRefusal` says so, else keep
        what it decided (`decided`). Only on a connection with nothing else in progress (a pipelined request's
        answer must wait for the one before it), whose client reads its answers (else the server's own
        backpressure applies), and not an upgrade."""
        conn = self.conn
        assert conn is not None
        self.decided = None
        parser = conn.parser
        if conn.answering() or conn.write_paused or parser.should_upgrade():
            return False
        verdict = self._early.verdict(parser.get_method(), conn.url, conn.headers)
        if not isinstance(verdict, Refusal):
            self.decided = verdict
            return False
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive() and not conn.last_answer
        conn.transport.write(self._early.answer(verdict, conn.server_state.default_headers, keep_alive))
        self.discarding, self._keep_alive = True, keep_alive
        # The body it discards gets --read-timeout-s too, as the front gives it.
        conn.set_deadline(conn.loop.time() + conn.read_timeout)
        return True

    def refusal_complete(self) -> None:
        """The refused request's body has been read: close, or wait for the next request as after any answer."""
        conn = self.conn
        assert conn is not None
        self.discarding = False
        conn.server_state.total_requests += 1
        if conn.transport.is_closing():
            return
        if not self._keep_alive:
            conn.transport.close()
            return
        conn.set_deadline(conn.loop.time() + conn.keep_alive_s)
        self.hold_check = self._holds is not None

    def hold_if_crowded(self) -> None:
        """Pause reading the kept-alive connection, just answered, if its last request's model could not take its
        next request at the same level now (servers/holding.py): that request waits unread in TCP, costing no
        CPU, instead of being read and refused. Not while a request is being parsed or waits in the pipeline."""
        conn = self.conn
        if self._holds is None or self.held or conn is None or conn.busy() or conn.transport.is_closing():
            return
        target = self._early.hold(conn.parser.get_method(), conn.url, conn.headers)
        if target is None:
            return
        runtime, level, wait = target
        conn.set_deadline(None)  # held, it is not idle: its keep-alive runs again once read
        conn.pause_reading()
        self.held = True
        self._holds.hold(self, runtime, level, wait)

    def release_hold(self) -> None:
        """`ReadHolds` lets the connection go: read its next request."""
        self.held = False
        conn = self.conn
        if conn is None or conn.transport.is_closing():
            return
        conn.resume_reading()
        conn.set_deadline(conn.loop.time() + conn.keep_alive_s)

    def release(self) -> None:
        """Let the connection go now (the server stops), out of the holds' queue."""
        self.forget()
        self.release_hold()

    def close(self) -> None:
        """The connection is lost: out of the holds' queue, and its reference let go (no reference cycle)."""
        self.forget()
        self.conn = None

    def forget(self) -> None:
        """Out of the holds' queue, if held (the connection is closing, or let go)."""
        if self.held and self._holds is not None:
            self._holds.forget(self)
            self.held = False
