"""Admission control besides the queue bound: request deadlines and rate limits.

The queue bound (`--max-queue`, 503) lives in `BatchQueue.put`, where the queue is. Deadlines come from the
configured default and the client's `X-Request-Timeout-Ms`, capped by `--max-timeout-ms` (504 past them). The
rate limit is a token bucket per server process (429 with Retry-After).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from twinserve.config import Config
from twinserve.errors import ClientError, RateLimited

__all__ = ["TIMEOUT_HEADER", "TokenBucket", "deadline_from", "rate_limiter"]

TIMEOUT_HEADER = "X-Request-Timeout-Ms"


def deadline_from(header: str | None, config: Config) -> float | None:
    """The request's deadline on the monotonic clock, or None for no deadline."""
    if header is None:
        timeout_ms = config.timeout_ms
    else:
        try:
            timeout_ms = int(header)
        except ValueError:
            timeout_ms = 0
        if timeout_ms <= 0:
            raise ClientError(f"{TIMEOUT_HEADER} must be a positive whole number of milliseconds, got {header!r}")
        timeout_ms = min(timeout_ms, config.max_timeout_ms)
    if timeout_ms is None:
        return None
    return time.monotonic() + timeout_ms / 1000


class TokenBucket:
    """Rate limiting: `rate` requests per second on average, bursts up to `burst`. Thread-safe."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._lock = threading.Lock()
        self.rejected = 0

    def acquire(self) -> None:
        """Take one token, or raise RateLimited (429) with the seconds until one is available."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            self.rejected += 1
            wait = (1 - self._tokens) / self.rate
        raise RateLimited(
            f"rate limit of {self.rate:g} requests/s exceeded; retry in {wait:.2f} s",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )


def rate_limiter(config: Config) -> TokenBucket | None:
    """The per-process bucket: the configured global rate is split evenly over the server processes."""
    if config.rate_limit is None:
        return None
    workers = config.effective_workers
    burst = config.rate_burst if config.rate_burst is not None else max(1, math.ceil(config.rate_limit))
    return TokenBucket(config.rate_limit / workers, max(1, math.ceil(burst / workers)))
