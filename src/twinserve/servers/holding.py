"""Connections held unread while what they wait for is full: a crowd waits in TCP, costing no CPU, instead of
being refused and sending again at once (a closed-loop client refused comes straight back).

`Holding` is the per-level FIFO both fronts use. The sync worker's poller holds a request it has read whole
(servers/sync/admission.py). The async fronts' HTTP server cannot look at unread bytes, so
`ReadHolds` holds a kept-alive connection right after an answer, by its last request: when that request's model
could not take another at its level now, the connection's reading is paused (uvicorn's flow control) before its
next request is read. A closed-loop client's next request is nearly always for the same model at the same level;
a request for another model waits at most its level's share of `--max-queue-wait-ms`, as it would have in the
queue. Each model's held connections are let go, the highest level first, as its batch queue takes requests
again (a look every `TICK_S` while any is held), and at that wait when it does not: their requests are then read
and admitted, or refused from their head (fronts/early.py) if the queue is still full.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["TICK_S", "Holding", "ReadHolds"]

#: How often `ReadHolds` looks at the queues of held connections' models while any are held.
TICK_S = 0.002


class Holding:
    """Connections held unread, one FIFO per priority level (1 the highest): what a crowd sends waits in TCP,
    costing no CPU, instead of being refused and sent again at once.

    Each connection is held until its level's share of `--max-queue-wait-ms` has passed (`expired`), or until
    what it waits for (the sync request threads' backlog, a model's batch queue) lets its level in again
    (`release`), the highest level first."""

    def __init__(self, levels: int) -> None:
        self._queues: list[deque[tuple[float, Any]]] = [deque() for _ in range(levels)]
        self._admitted: list[deque[tuple[float, Any]]] = [deque() for _ in range(levels)]
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, conn: Any, level: int, deadline: float) -> None:
        """Hold `conn`, whose request is at `level`, until `deadline` (time.monotonic) at the latest."""
        self._queues[level - 1].append((deadline, conn))  # one wait per level: each deque stays sorted
        self._count += 1

    def admit(self, conn: Any, level: int, deadline: float) -> None:
        """Hold `conn`, whose wait is spent and whose request is let in, until its turn: before the connections
        held at its level, after every higher level's; or until `deadline` (`overdue`), should the higher levels
        keep every turn."""
        self._admitted[level - 1].append((deadline, conn))
        self._count += 1

    def release(self, admits: Callable[[int], bool]) -> Any | None:
        """The next connection of the highest level held, if `admits` lets that level in now; else None: one let
        in at its deadline (`admit`) first, then the longest held. A level past its share means every lower level
        is too, so no lower level is looked at."""
        for level, (queue, admitted) in enumerate(zip(self._queues, self._admitted, strict=True), start=1):
            if queue or admitted:
                if not admits(level):
                    return None
                self._count -= 1
                return (admitted or queue).popleft()[1]
        return None

    def holds_up_to(self, level: int) -> bool:
        """Whether any connection is held at `level` or a higher one (a lower number)."""
        return any(self._queues[:level]) or any(self._admitted[:level])

    def ahead_of(self, level: int) -> int:
        """How many held connections go before one let in at `level` now (`admit`): every one held at a higher
        level, and those let in at its level before it."""
        higher = zip(self._queues[: level - 1], self._admitted[: level - 1], strict=True)
        return sum(len(queue) + len(admitted) for queue, admitted in higher) + len(self._admitted[level - 1])

    def expired(self, now: float, limit: int | None = None) -> list[tuple[Any, int]]:
        """The connections whose deadline is past (the first `limit` of them, by level), taken out, each with its
        level."""
        out: list[tuple[Any, int]] = []
        for level, queue in enumerate(self._queues, start=1):
            while queue and queue[0][0] <= now and (limit is None or len(out) < limit):
                out.append((queue.popleft()[1], level))
        self._count -= len(out)
        return out

    def overdue(self, now: float, limit: int) -> list[Any]:
        """The connections let in (`admit`) whose deadline is past, at most `limit`, taken out."""
        out: list[Any] = []
        for admitted in self._admitted:
            while admitted and admitted[0][0] <= now and len(out) < limit:
                out.append(admitted.popleft()[1])
        self._count -= len(out)
        return out

    def remove(self, conn: Any) -> bool:
        """Take `conn` out, wherever it is held; whether it was."""
        for queue in (*self._queues, *self._admitted):
            for entry in queue:
                if entry[1] is conn:
                    queue.remove(entry)
                    self._count -= 1
                    return True
        return False

    def next_deadline(self) -> float | None:
        return min((queue[0][0] for queue in (*self._queues, *self._admitted) if queue), default=None)

    def drain(self) -> list[Any]:
        """Every held connection, taken out (the worker is stopping)."""
        out = [conn for queue in self._queues for _, conn in queue]
        out += [conn for admitted in self._admitted for _, conn in admitted]
        for queue in (*self._queues, *self._admitted):
            queue.clear()
        self._count = 0
        return out


class Held(Protocol):
    """What `ReadHolds` holds: a connection whose reading it paused."""

    def release_hold(self) -> None:
        """Read again (the connection's next request, if the client sent it, is read next)."""


class Queue(Protocol):
    """What a held connection waits for: its last request's model (core/runtime.py `ModelRuntime`)."""

    def admits(self, priority: int = 1) -> bool: ...

    def room(self) -> int: ...


class ReadHolds:
    """One event loop's held connections, per model: let go as the model's queue takes requests again (at most
    `room()` at a time, the highest level first), or at their deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, levels: int) -> None:
        self.loop = loop
        self._levels = levels
        self._held: dict[Queue, Holding] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return sum(len(holding) for holding in self._held.values())

    def hold(self, conn: Held, queue: Queue, level: int, wait_s: float) -> None:
        """Hold `conn` (its reading already paused) until `queue` admits `level` again, `wait_s` at the longest."""
        holding = self._held.get(queue)
        if holding is None:
            holding = self._held[queue] = Holding(self._levels)
        holding.add(conn, level, time.monotonic() + wait_s)
        if self._timer is None:
            self._timer = self.loop.call_later(TICK_S, self._tick)

    def forget(self, conn: Held) -> bool:
        """Take `conn` out (its connection closing); whether it was held."""
        return any(holding.remove(conn) for holding in self._held.values())

    def _tick(self) -> None:
        self._timer = None
        now = time.monotonic()
        for queue, holding in list(self._held.items()):
            for conn, _ in holding.expired(now):
                conn.release_hold()
            room = queue.room()  # a request let go counts in the queue only once read: no more than it takes now
            while room > 0 and (conn := holding.release(queue.admits)) is not None:
                conn.release_hold()
                room -= 1
            if not holding:
                del self._held[queue]
        if self._held:
            self._timer = self.loop.call_later(TICK_S, self._tick)
