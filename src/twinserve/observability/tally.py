"""Counts (and other sums) kept in a plain dict and handed on at most once an interval: for events too frequent
to count one metric write each.

A multiprocess counter's `inc()` costs about as much as refusing a request early, so under a flood the metrics
would be a large share of each refusal. `Tally` adds to a dict entry instead and writes the sums at most every
`interval_s`: the first event after a quiet interval at once, the rest at the interval's end, everything on
demand (`flush`, before `/metrics` renders, at exit). The same shape serves the aggregate refusal log
(observability/refusals.py) and every served request's metrics (observability/sums.py).
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["FLUSH_INTERVAL_S", "Tally"]

K = TypeVar("K", bound=Hashable)
FLUSH_INTERVAL_S = 0.05


class Tally(Generic[K]):
    """Sums per key (counts, or any amounts: seconds, a gauge's moves), handed to `write(sums, seconds)` at most
    every `interval_s`, and on `flush()`; `seconds` is the time from the first of those sums to the write.
    Thread-safe."""

    def __init__(
        self,
        write: Callable[[dict[K, float], float], None],
        interval_s: float = FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time, and `flush` waits for one under way
        self._counts: dict[K, float] = {}
        self._since = 0.0  # when the first of the held counts came
        self._next = 0.0  # when the counts may next be written (0: at once)
        self._due = False  # counts are held for the interval's end
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        # The last interval's counts are written when the process exits (a server worker stopping).
        atexit.register(_flush_at_exit, weakref.ref(self))
        # A forked child (a model worker) would write its parent's held counts again, from its own process.
        os.register_at_fork(after_in_child=functools.partial(_forget_in_child, weakref.ref(self)))

    def add(self, key: K, n: float = 1) -> None:
        self.add_all(((key, n),))

    def add_all(self, amounts: Iterable[tuple[K, float]]) -> None:
        """Add each `(key, n)` of `amounts`, at one time (a histogram's observation is a bucket and a sum)."""
        with self._lock:
            now = self._clock()
            counts = self._counts
            if not counts:
                self._since = now
            for key, n in amounts:
                counts[key] = counts.get(key, 0) + n
            if now < self._next:
                if not self._due:  # the interval's counts, written when it ends even if nothing follows
                    self._due = True
                    self._wake_writer()
                return
        self.flush()

    def _wake_writer(self) -> None:
        """Have this tally's writer thread write the held counts when the interval ends. One thread for the
        tally's life (started again in a forked child, where it does not run): a `threading.Timer` per interval
        made its caller wait for a new thread to start, which under a contended GIL took a visible share of
        gthread's poller."""
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._write_when_due, name="twinserve-tally", daemon=True)
            self._writer.start()
        self._wake.set()

    def _write_when_due(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                delay = self._next - self._clock()
            if delay > 0:
                time.sleep(delay)
            with self._lock:
                due = self._due  # else a flush (a scrape, a count after the interval) wrote them meanwhile
            if due:
                self.flush()

    def flush(self) -> None:
        """Write what was counted since the last write (nothing if nothing was). Returns once every count taken
        before it is written, by this call or by one already writing (a scrape that flushes first reads them all)."""
        with self._writing:
            with self._lock:
                self._due = False
                counts, self._counts = self._counts, {}
                now = self._clock()
                self._next = now + self.interval_s
                seconds = max(now - self._since, 0.0)
            if counts:  # outside `_lock`: counting goes on meanwhile
                self._write(counts, seconds)


def _forget_in_child(ref: weakref.ref[Tally[Any]]) -> None:
    tally = ref()
    if tally is not None:
        tally._counts = {}
        tally._due = False
        tally._lock = threading.Lock()  # another thread of the parent may have held it at the fork
        tally._writing = threading.Lock()
        tally._wake = threading.Event()


def _flush_at_exit(ref: weakref.ref[Tally[Any]]) -> None:
    tally = ref()
    if tally is not None:
        tally.flush()
