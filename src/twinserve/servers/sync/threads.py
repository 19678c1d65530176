"""The sync worker's request threads, taking requests by priority level instead of first come, first served.

A first-come pool (gunicorn's gthread hands connections to a `ThreadPoolExecutor`) makes a request at level 1,
handed over behind a thread's worth of level-3 requests, wait for all of them to be taken up first.

`LevelledThreadPool` is the worker's pool (servers/sync/worker.py): threads and futures, but each thread takes the
waiting request of the highest level next (1 the highest), and the longest waiting within a level.
`ahead_of(level)` says how many waiting requests a thread would take before one at `level`: the poller
(servers/sync/admission.py) holds a request while that is a thread's worth, not while the whole queue
is, so a high priority goes to the threads at once past a queue of lower levels, and is taken up next.

`QUICK` is for requests the app answers without the model (an invalid `X-Priority`: 400). They count at no level:
not in `ahead_of`, not in the backlog the queue bound weighs (`counted`); counted at the default level they were (a
crowd sending `X-Priority: 10` filled the backlog, and every valid level-1 request was shed, 503 `queue_full`,
while the crowd got its 400s). And they are taken after every valid level: taken first, a crowd of them (500 wrk
connections, each answered in a fraction of a millisecond) kept the threads from every valid request
(benchmarks/overload.py (e): 8 level-1 connections got no answer in 8 s). The poller holds valid requests to a
thread's worth per level, so the threads' queue empties of them between turns, and the invalid ones get theirs.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

__all__ = ["QUICK", "LevelledThreadPool"]

#: The level of requests answered without the model: taken after every valid level, counted at none.
QUICK = 0
#: Where `QUICK` requests sort in the queue: after every level a request may ask for.
_AFTER_EVERY_LEVEL = 1 << 30


class LevelledThreadPool(Executor):
    """`workers` threads that run what is submitted, the lowest `level_of(first argument)` first, then in order of
    submission; `shutdown(wait=False)` lets them finish what is queued. Its threads are daemons: gthread waits for
    its requests in flight (within `--graceful-timeout`) before it shuts the pool down, and a worker that fails
    is not kept alive by threads idle on an empty queue (`ThreadPoolExecutor` wakes those at exit instead)."""

    def __init__(self, workers: int, level_of: Callable[[Any], int], name: str = "request") -> None:
        self._level_of = level_of
        self._queue: list[tuple[int, int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._waiting: Counter[int] = Counter()  # per level
        self._order = itertools.count()
        self._ready = threading.Condition(threading.Lock())
        self._stopping = False
        self._idle = 0  # threads waiting for work
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def __len__(self) -> int:
        return len(self._queue)

    def waits(self) -> bool:
        """Whether a request submitted now would wait for a thread (none idle for it): only then may a later
        one at a higher level go ahead of it, so only then does its level matter (read without the lock)."""
        return len(self._queue) >= self._idle

    def ahead_of(self, level: int) -> int:
        """How many waiting requests a thread takes up before one submitted now at `level`: those at it or higher
        (read without the lock, as a count the poller decides on; a few levels at most)."""
        return sum(count for at, count in list(self._waiting.items()) if QUICK < at <= level)

    def counted(self) -> int:
        """How many requests wait at a level (all but the `QUICK` ones; read without the lock)."""
        return len(self._queue) - self._waiting[QUICK]

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if kwargs:  # gthread passes none
            fn = functools.partial(fn, **kwargs)
        level = self._level_of(args[0]) if args else 0
        future: Future[Any] = Future()
        with self._ready:
            if self._stopping:
                raise RuntimeError("cannot schedule new futures after shutdown")
            rank = _AFTER_EVERY_LEVEL if level == QUICK else level
            heapq.heappush(self._queue, (rank, next(self._order), level, future, fn, args))
            self._waiting[level] += 1
            self._ready.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._ready:
            self._stopping = True
            if cancel_futures:
                for entry in self._queue:
                    entry[3].cancel()
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                if not self._queue:
                    return  # stopping, and nothing left to run
                _, _, level, future, fn, args = heapq.heappop(self._queue)
                self._waiting[level] -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # the future carries it, as ThreadPoolExecutor's does
                future.set_exception(exc)
            else:
                future.set_result(result)
                del result
