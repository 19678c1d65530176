"""Connections spread over the sync architecture's workers instead of piling onto one.

The workers share one listening socket, and a connection goes to whichever worker's poller wakes first and
accepts it. A client that opens its keep-alive connections in a burst (a connection pool, wrk, a load balancer) can
so land all of them on one worker, which then runs every request on its one interpreter while the other workers
idle: 16 connections on two workers, the iris example, went 16 to 0 in most runs here and were served at 193-197
requests a second on one core; balanced, 789-832.

Each worker publishes how many connections it holds in an array shared by all workers (`ConnectionShares`: one
slot per worker, claimed by the arbiter before it forks the worker and freed when the worker exits). A worker
holding more than one connection above the least loaded other one leaves a new connection to it: it stops
accepting, looks again every `RECHECK_S`, and accepts anyway once the connection has waited `DEFER_S` (the others
are busy, stuck or gone), so a connection waits at most that long for a busy worker. The count is of open
connections, which is what a kept-alive client's load follows; with a connection per request it is the requests
in progress.
"""

from __future__ import annotations

import ctypes
from multiprocessing.sharedctypes import RawArray
from typing import Any

__all__ = ["DEFER_S", "Balance", "ConnectionShares"]

#: How long a worker holding more connections than another leaves a new connection to the others at most. Longer
#: than a busy worker's poller may take to get the interpreter back from its request threads (5 ms switch interval).
DEFER_S = 0.01
#: While it leaves a connection to the others, a worker looks again this often: the counts change meanwhile.
RECHECK_S = 0.001
#: How many more connections than the least loaded other worker a worker may hold and still accept. Counts move
#: by one with each connection-per-request client, and two workers leaving a connection to each other, each one
#: ahead by one in turn, would leave it waiting: connection-per-request clients would slow to a crawl.
SLACK = 1

_FREE = -1


class ConnectionShares:
    """Open connections per worker, in memory the arbiter shares with the workers it forks.

    The arbiter alone claims and frees slots (single-threaded, so no lock); each worker writes only its own slot.
    """

    def __init__(self, slots: int) -> None:
        self._counts: Any = RawArray(ctypes.c_long, [_FREE] * slots)

    def claim(self, worker: Any) -> None:
        """In the arbiter, before forking `worker`: give it a free slot (none if all are taken: no balancing)."""
        free = [slot for slot, count in enumerate(self._counts) if count == _FREE]
        worker.connection_slot = free[0] if free else None
        if free:
            self._counts[free[0]] = 0

    def release(self, worker: Any) -> None:
        """In the arbiter, once `worker` has exited: its connections are gone, and its slot is free again."""
        slot = getattr(worker, "connection_slot", None)
        if slot is not None:
            self._counts[slot] = _FREE

    def publish(self, slot: int, connections: int) -> None:
        self._counts[slot] = connections

    def fewest_elsewhere(self, slot: int) -> int | None:
        """The fewest connections any other live worker holds; None without another."""
        counts = [count for other, count in enumerate(self._counts) if other != slot and count != _FREE]
        return min(counts) if counts else None


class Balance:
    """One worker's side: publishes its connections, and says whether it takes the next one now (`my_turn`)."""

    __slots__ = ("_deferred_since", "_shares", "_slot", "paused_until")

    def __init__(self, shares: ConnectionShares | None, slot: int | None) -> None:
        self._shares = shares if slot is not None else None
        self._slot = slot if slot is not None else 0
        self._deferred_since: float | None = None
        #: While another worker may take the next connection, this one looks again at this time.
        self.paused_until = 0.0

    def publish(self, connections: int) -> None:
        if self._shares is not None:
            self._shares.publish(self._slot, connections)

    def my_turn(self, connections: int, now: float) -> bool:
        """Whether to accept with `connections` open; if not, accepting pauses until `paused_until`."""
        if self._shares is None:
            return True
        fewest = self._shares.fewest_elsewhere(self._slot)
        if fewest is None or connections <= fewest + SLACK:
            self._deferred_since = None
            return True
        if self._deferred_since is None:
            self._deferred_since = now
        elif now - self._deferred_since >= DEFER_S:  # still waiting: no other worker took it
            self._deferred_since = None
            return True
        self.paused_until = now + RECHECK_S
        return False

    def taken_elsewhere(self) -> None:
        """The listener was watched through a wait and had nothing: the connection deferred for, if any, went to
        another worker, and the next one is deferred anew."""
        self._deferred_since = None
