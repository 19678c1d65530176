"""Requests shed by admission control, logged in aggregate: one line per interval, never one per refusal; and in the
same way the requests the HTTP server could not read (`UNPARSED`: 400 `malformed_http`, 414, 431).

Under overload a log line per refusal would cost as much as the refusal and bury everything else. Each refusal is
still a debug-level request-log event and counted in `twinserve_rejected_requests_total`; at info level one
warning per interval gives the counts per model and reason. The first refusal after a quiet interval is logged
at once, and what is held is logged when the process exits (observability/tally.py keeps the counts).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from twinserve.observability.tally import Tally

__all__ = ["SHED", "SHED_CODES", "UNPARSED", "RefusalLog"]

#: Error codes that mean "shed by admission", logged in aggregate.
SHED_CODES = frozenset({"queue_full", "rate_limited", "deadline_unmeetable"})
INTERVAL_S = 10.0

#: The line of requests shed by admission, each also a debug-level request event.
SHED = "refused %d request(s) in %.1f s (model reason count: %s); each is a debug-level request event"
#: The line of requests the HTTP server answered itself, unread: a flood of broken requests is one line an interval.
UNPARSED = (
    "answered %d request(s) the HTTP server could not read in %.1f s (model reason count: %s), each before any "
    "route, closing its connection"
)

logger = logging.getLogger("twinserve.admission")


class RefusalLog:
    """Counts refusals per (model, code) and logs them as one line per `interval_s`, `message` (`SHED` or `UNPARSED`)
    with the count, the seconds and the counts per model and code. Thread-safe."""

    def __init__(
        self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic, message: str = SHED
    ) -> None:
        self._tally: Tally[tuple[str, str]] = Tally(functools.partial(_log, message), interval_s, clock)

    def refused(self, model: str, code: str, n: int = 1) -> None:
        self._tally.add((model or "-", code), n)

    def flush(self) -> None:
        """Log what was counted since the last line (nothing if nothing was)."""
        self._tally.flush()


def _log(message: str, counts: dict[tuple[str, str], float], seconds: float) -> None:
    ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    detail = ", ".join(f"{model} {code} {n:.0f}" for (model, code), n in ranked)
    logger.warning(message, sum(counts.values()), seconds, detail)
