"""Admission control that is not the queue bound: request deadlines.

The queue bound (`--max-queue`, 503) lives in `BatchQueue.put`, where the queue is; deadlines are decided here,
from the configured default and the client's `X-Request-Timeout-Ms`, capped by `--max-timeout-ms`.
"""

from __future__ import annotations

import time

from twinserve.config import Config
from twinserve.errors import ClientError

__all__ = ["TIMEOUT_HEADER", "deadline_from"]

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
