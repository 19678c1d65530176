from __future__ import annotations

import time

import pytest

from twinserve.config import load_config
from twinserve.core.admission import TokenBucket, deadline_from, rate_limiter
from twinserve.errors import ClientError, RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_bursts_then_refills() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    for _ in range(3):
        bucket.acquire()
    with pytest.raises(RateLimited) as info:
        bucket.acquire()
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"
    clock.now += 0.5  # one token back at 2/s
    bucket.acquire()
    with pytest.raises(RateLimited):
        bucket.acquire()
    assert bucket.rejected == 2


def test_rate_is_split_across_server_processes() -> None:
    limiter = rate_limiter(load_config(arch="sync", workers=4, rate_limit=100.0))
    assert limiter is not None and limiter.rate == 25.0 and limiter.burst == 25
    assert rate_limiter(load_config()) is None


def test_deadlines_from_config_and_header() -> None:
    config = load_config(timeout_ms=1000, max_timeout_ms=5000)
    now = time.monotonic()
    assert deadline_from(None, config) == pytest.approx(now + 1.0, abs=0.1)
    assert deadline_from("200", config) == pytest.approx(now + 0.2, abs=0.1)
    assert deadline_from("999999", config) == pytest.approx(now + 5.0, abs=0.1)  # capped
    assert deadline_from(None, load_config()) is None
    for bad in ("0", "-3", "soon", "1.5"):
        with pytest.raises(ClientError, match="X-Request-Timeout-Ms"):
            deadline_from(bad, config)
