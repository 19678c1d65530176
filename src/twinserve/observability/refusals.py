"""Requests shed by admission control, logged in aggregate: one line per interval, never one per refusal.

Under overload a server may refuse thousands of requests a second (503 `queue_full`, 429 `rate_limited`, 504
`deadline_unmeetable`); a log line each would cost as much as the refusal itself and bury everything else. Each
refusal is still a request-log event at debug level, and counted in `twinserve_rejected_requests_total`; at info
level the log gets one warning per interval with the counts per model and reason. The first refusal after a
quiet interval is logged at once, so a lone refusal is not held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["SHED_CODES", "RefusalLog"]

#: Error codes that mean "shed by admission", logged in aggregate.
SHED_CODES = frozenset({"queue_full", "rate_limited", "deadline_unmeetable"})
INTERVAL_S = 10.0

logger = logging.getLogger("twinserve.admission")


class RefusalLog:
    """Counts refusals per (model, code) and logs them as one line per `interval_s`. Thread-safe."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._since = 0.0
        self._next = 0.0  # when the next line may be written (0: at once)
        self._timer: threading.Timer | None = None

    def refused(self, model: str, code: str) -> None:
        with self._lock:
            now = self._clock()
            if not self._counts:
                self._since = now
            self._counts[(model or "-", code)] += 1
            if now < self._next:
                if self._timer is None:  # the interval's line, written when it ends even if no refusal follows
                    self._timer = threading.Timer(self._next - now, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def flush(self) -> None:
        """Log what was counted since the last line (nothing if nothing was)."""
        with self._lock:
            self._timer = None
            counts, self._counts = self._counts, Counter()
            now = self._clock()
            self._next = now + self.interval_s
            seconds = max(now - self._since, 0.0)
        if not counts:
            return
        detail = ", ".join(f"{model} {code} {n}" for (model, code), n in counts.most_common())
        logger.warning(
            "refused %d request(s) in %.1f s (model reason count: %s); each is a debug-level request event",
            sum(counts.values()),
            seconds,
            detail,
        )
