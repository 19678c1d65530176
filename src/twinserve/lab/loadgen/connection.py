"""The load generator's connections: a bare asyncio protocol per TCP connection (`_Wire`), the run's connection
slots with their deadlines (`Connection`), and the clock that times each response's arrival (`ArrivalClock`).

A slot reports to its owner (`ConnectionOwner`), the level in progress, through a protocol declared here, so that
this module need not know the run that drives it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Protocol, cast

from twinserve.lab.loadgen.http import ResponseParser
from twinserve.lab.loadgen.tally import Outcome

__all__ = ["TIMER_TICK_S", "ArrivalClock", "Connection", "ConnectionOwner"]

#: The shortest wait on a deadline timer; timeouts may read up to this late.
TIMER_TICK_S = 0.001


class ConnectionOwner(Protocol):
    """What a connection slot reports to: the level in progress (`LevelRun`), which runs its connects as tasks
    and takes every exchange's outcome."""

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run `coroutine` as a task of the level."""

    def complete(self, connection: Connection, outcome: Outcome, finished: float, code: bytes | None = None) -> None:
        """The exchange in progress on `connection` ended in `outcome` at `finished` (`code`: an error answer's
        code from its body)."""


class ArrivalClock:
    """Times responses from when the event loop learned they had arrived, not from when their turn came.

    The loop hands a batch of ready sockets to their protocols one after another, and a Python callback costs tens of
    microseconds: timed in its own turn, the last response of a burst of 64 would read a millisecond or more late.
    Every socket of a batch was already readable when the loop began to serve it, so the first reading of the batch,
    which a callback queued behind the batch clears, bounds each of their arrivals from above. That holds for a
    response read whole in one chunk; one that came in pieces may have had its last piece land during the batch, so
    it is timed on the spot instead.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._batch_began: float | None = None

    def arrived(self, whole: bool) -> float:
        """When the response just read had arrived, at the latest; `whole`: it came in the one chunk just read."""
        if not whole:
            return time.perf_counter()
        if self._batch_began is None:
            self._batch_began = time.perf_counter()
            self._loop.call_soon(self._end_batch)
        return self._batch_began

    def _end_batch(self) -> None:
        self._batch_began = None


class _Wire(asyncio.Protocol):
    """One TCP connection: writes a request, frames the response as it arrives, and reports to its slot at once.

    A bare protocol rather than asyncio streams, and callbacks rather than futures: no reader buffer, no per-read
    futures, no task switch between a response and the next request, which goes out from the very callback that
    read the response's last bytes. The response is timed by the run's `ArrivalClock`.
    """

    def __init__(self, slot: Connection) -> None:
        self._slot = slot
        self._transport: asyncio.Transport | None = None
        self._parser = ResponseParser()
        self._busy = False
        self._closing = False
        self.lost: asyncio.Future[None] = slot.loop.create_future()

    @property
    def idle(self) -> bool:
        """Open, with no exchange in progress: ready for the next request."""
        return not self._busy and not self._closing

    @property
    def busy(self) -> bool:
        return self._busy

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def send(self, request: bytes) -> None:
        assert self._transport is not None and self.idle
        self._busy = True
        self._transport.write(request)

    def data_received(self, data: bytes) -> None:
        if not self._busy:  # bytes no request asked for: the framing is lost
            self._close()
            return
        whole = self._parser.between_responses
        try:
            done = self._parser.feed(data)
        except ValueError as error:
            self.fail(error)
            return
        if done:
            finished = self._slot.clock.arrived(whole)
            self._busy = False
            parser = self._parser
            if not parser.keep_alive:
                self._close()
            status = parser.status
            self._slot.on_response(status, finished, parser.error_code() if status >= 300 else None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(None)
        self._closing = True
        if self._busy and self._parser.ends_at_close:
            self._busy = False
            self._slot.on_response(self._parser.status, time.perf_counter(), self._parser.error_code())
        self.fail(exc or ConnectionResetError("the server closed the connection mid-response"))

    def fail(self, error: Exception) -> None:
        """Close the connection; if an exchange was in progress, it failed with `error`."""
        self._close()
        if self._busy:
            self._busy = False
            self._slot.on_failure(error)

    def abandon(self) -> None:
        """Close the connection without a word to the slot."""
        self._busy = False
        self._close()

    def _close(self) -> None:
        if not self._closing:
            self._closing = True
            if self._transport is not None:
                self._transport.abort()


class Connection:
    """One connection slot of a run: sends the requests it is handed, one at a time, and tells the run each outcome.

    Any failure closes its connection, and the next request opens a fresh one. Deadlines share one timer per slot,
    re-armed lazily: a slot's deadlines mostly come later than the one its timer is set for, so when that timer fires
    with the exchange in progress not yet due, it is set again for that exchange's deadline, rather than one timer
    being made and cancelled per request.
    """

    def __init__(self, run: ConnectionOwner, address: str, port: int, clock: ArrivalClock) -> None:
        self._run = run
        self._address, self._port = address, port
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self._wire: _Wire | None = None
        self._deadline = 0.0  # of the exchange in progress
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0.0  # the deadline the timer was set for
        #: The exchange in progress: when it fell due and when it went out (`time.perf_counter` readings).
        self.due = self.sent_at = 0.0
        #: Its request, and how many times it was sent again after a refusal (`LoadSpec.retries`).
        self.request = b""
        self.retried = 0

    def send(self, request: bytes, due: float, now: float, deadline: float) -> None:
        """Send `request`, due at `due`, now; its outcome comes back through the run, by `deadline` at the latest."""
        self.due, self.sent_at, self.request = due, now, request
        wire = self._wire
        if wire is not None and wire.idle:
            self._arm(deadline, now)
            wire.send(request)
        else:
            self.close()
            self._run.spawn(self._connect_and_send(request, deadline))

    async def _connect_and_send(self, request: bytes, deadline: float) -> None:
        loop = self.loop
        try:
            async with asyncio.timeout(deadline - time.perf_counter()):
                _, wire = await loop.create_connection(lambda: _Wire(self), self._address, self._port)
        except OSError as error:  # TimeoutError too
            self._run.complete(self, _connect_outcome(error), time.perf_counter())
            return
        self._wire = wire
        self._arm(deadline, time.perf_counter())
        wire.send(request)

    def on_response(self, status: int, finished: float, code: bytes | None = None) -> None:
        """The exchange ended in an answer: its status, and for an error the server's code from its body."""
        self._run.complete(self, status, finished, code)

    def on_failure(self, error: Exception) -> None:
        self._run.complete(self, _outcome(error), time.perf_counter())

    def _arm(self, deadline: float, now: float) -> None:
        self._deadline = deadline
        if self._timer is None or self._timer_deadline > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._set_timer(deadline, now)

    def _set_timer(self, deadline: float, now: float) -> None:
        self._timer_deadline = deadline
        # uvloop's timers tick in milliseconds and may fire up to one early: a shorter wait would spin on a near miss.
        self._timer = self.loop.call_later(max(deadline - now, TIMER_TICK_S), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        wire = self._wire
        if wire is None or not wire.busy:
            return  # idle: the next exchange arms it again
        now = time.perf_counter()
        if now >= self._deadline:
            wire.fail(TimeoutError())
        else:
            self._set_timer(self._deadline, now)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._wire is not None:
            self._wire.abandon()
            self._wire = None

    async def aclose(self) -> None:
        wire = self._wire
        self.close()
        if wire is not None:
            await wire.lost


def _connect_outcome(error: OSError) -> str:
    """The transport error kind a failed connect counts as: refused (nothing listens), timed out (the server's
    accept backlog is full, or its host unreachable), or another error (this machine out of ports or files)."""
    if isinstance(error, ConnectionRefusedError):
        return "connect_refused"
    if isinstance(error, TimeoutError):
        return "connect_timeout"
    return "connect_error"


def _outcome(error: Exception) -> str:
    """The transport error kind `error` counts as."""
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionRefusedError):
        return "connect_refused"
    if isinstance(error, ConnectionError):
        return "reset"
    return "other"
