"""Requests the sync worker's poller holds while its request threads are all busy (servers/sync/admission.py): a
crowd waits in the poller, costing no thread, instead of being refused and sending again at once (a closed-loop
client refused comes straight back). One FIFO per priority level, the highest let go first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Holding"]


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
