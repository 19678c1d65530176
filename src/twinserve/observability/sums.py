"""Every served request's metric writes, summed per interval: one write per metric and interval, not per request.

A request makes several multiprocess metric writes, and prometheus-client's multiprocess writes (a lock, a pid
check and an mmap write each) were a large share of twinserve's own CPU per request. `MetricSums` adds each write
to a dict entry instead (observability/tally.py) and writes the sums each interval, and always before this
process renders `/metrics` or reads its totals, or when its last in-flight request ends; another process's scrape
sees them at most an interval late. Histograms are written through prometheus-client's own `_buckets` and `_sum`
fields, since prometheus-client has no public way to add many observations at once;
tests/unit/observability/test_sums.py renders both ways, so a change there fails a test, not a scrape.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

from twinserve.observability.tally import FLUSH_INTERVAL_S, Tally

__all__ = ["MetricSums", "Writes", "metric_sums"]

_AMOUNT, _SUM = -1, -2  # a counter's or gauge's amount, a histogram's sum; a bucket is its index


class Writes(list[tuple[tuple[Any, int], float]]):
    """Metric writes gathered to be summed at one time (`MetricSums.add`): a request's, or a batch's."""

    def inc(self, child: Any, amount: float = 1.0) -> None:
        """A counter's `inc(amount)`, or a gauge's (a negative amount moves it down)."""
        self.append(((child, _AMOUNT), amount))

    def observe(self, child: Any, value: float) -> None:
        """A histogram's `observe(value)`."""
        bucket = bisect.bisect_left(child._upper_bounds, value)  # the first bound >= value, as `observe` finds it
        self.append(((child, bucket), 1))
        self.append(((child, _SUM), value))

    def observe_all(self, child: Any, values: list[float]) -> None:
        """A histogram's `observe` of each of `values` (a batch's queue waits)."""
        bounds = child._upper_bounds
        self.extend(((child, bisect.bisect_left(bounds, value)), 1) for value in values)
        self.append(((child, _SUM), sum(values)))


class MetricSums:
    """Counter increments, gauge moves and histogram observations of labelled metric children (what `labels()`
    returns), written summed at most every `interval_s`. Thread-safe."""

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self._tally: Tally[tuple[Any, int]] = Tally(_write, interval_s)
        self._lock = threading.Lock()
        self._open = 0  # requests between `opened` and `ended`

    def add(self, writes: Writes) -> None:
        self._tally.add_all(writes)

    def opened(self, gauge: Any) -> None:
        """A request began: `gauge` (the in-flight requests) goes up. The process's first request in flight moves
        it at once (one write per idle-to-busy turn, as `ended` writes on each busy-to-idle one): held for the
        interval, a scrape answered by another worker would read an idle server while a request is being computed,
        and tune's `settle` would start its next probe on a backlog."""
        with self._lock:
            first = self._open == 0
            self._open += 1
        if first:
            gauge.inc(1)
        else:
            self._tally.add((gauge, _AMOUNT), 1)

    def ended(self, writes: Writes | None, gauge: Any | None) -> None:
        """A request's last `writes` (None: none); `gauge`: the in-flight gauge `opened` moved up for it (None:
        it was not counted there), moved down. When it was the process's last request in flight, every sum is
        written at once: so a client that waits for its answer and then reads the metrics or statistics of any
        process sees its request counted (the common case: requests one after another), and only a process
        that always has work in flight writes per interval."""
        if gauge is None:
            if writes:
                self._tally.add_all(writes)
            return
        writes = writes if writes is not None else Writes()
        writes.inc(gauge, -1)
        self._tally.add_all(writes)
        with self._lock:
            self._open -= 1
            idle = self._open == 0
        if idle:
            self.flush()

    def flush(self) -> None:
        """Write every sum held (before this process renders its metrics or reads them back)."""
        self._tally.flush()


def _write(sums: dict[tuple[Any, int], float], seconds: float) -> None:
    for (child, slot), amount in sums.items():
        if slot == _AMOUNT:
            if amount:  # a gauge's ups and downs in one interval may cancel out
                child.inc(amount)
        elif slot == _SUM:
            child._sum.inc(amount)
        else:
            child._buckets[slot].inc(amount)


_sums: MetricSums | None = None
_lock = threading.Lock()


def metric_sums() -> MetricSums:
    """This process's sums (one for every front and model, so that one flush writes them all)."""
    global _sums
    if _sums is None:
        with _lock:
            if _sums is None:
                _sums = MetricSums()
    return _sums
