from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

from twinserve.config import load_config
from twinserve.core import shared
from twinserve.core.admission import (
    Admission,
    QueueBound,
    Rate,
    TokenBucket,
    deadline_from,
    rate_limiter,
    shared_slot_count,
)
from twinserve.core.shared import SHARED_STATE_ENV, LocalSlots
from twinserve.errors import ClientError, QueueFull, RateLimited


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


def test_rate_rule_refills_and_says_how_long_to_wait() -> None:
    rule = Rate(per_second=2.0, burst=3)
    assert rule.take(0.0, 0.0, 50.0) == (2.0, 0.0)  # a bucket never used is full
    assert rule.take(0.0, 50.0, 50.0) == (0.0, 0.5)  # empty: one token in half a second
    assert rule.take(0.0, 50.0, 50.25) == (0.5, 0.25)
    assert rule.take(2.5, 50.0, 60.0) == (2.0, 0.0)  # refilled to the burst, not beyond


def test_queue_bound_counts_what_waits_plus_what_comes() -> None:
    bound = QueueBound(4)
    bound.check(3, 1, "the queue holds 3 instances")
    with pytest.raises(QueueFull) as info:
        bound.check(3, 2, "the queue holds 3 instances")
    assert info.value.message == "the queue holds 3 instances (--max-queue 4); retry shortly"
    assert info.value.headers == {"Retry-After": "1"}


def _take_all(path: str, attempts: int, started: Any) -> int:
    """In a worker process: try `attempts` requests against the server-wide bucket in the shared slots."""
    os.environ[SHARED_STATE_ENV] = path
    admission = Admission(load_config(arch="sync", workers=2, rate_limit=0.001, rate_burst=5))
    started.wait()
    taken = 0
    for _ in range(attempts):
        try:
            admission.rate()
        except RateLimited:
            continue
        taken += 1
    return taken


def test_server_wide_rate_is_exact_across_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes sharing the slots admit the burst exactly once between them, not once each."""
    monkeypatch.delenv(SHARED_STATE_ENV, raising=False)
    config = load_config(arch="sync", workers=2, rate_limit=0.001, rate_burst=5)
    path = shared.create(shared_slot_count(config, 0))
    try:
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(2) as pool:
            started = manager.Event()
            results = [pool.apply_async(_take_all, (path, 6, started)) for _ in range(2)]
            started.set()
            assert sum(r.get(timeout=60) for r in results) == 5
    finally:
        os.unlink(path)


def test_per_key_buckets_share_the_slots_after_the_global_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_STATE_ENV, raising=False)
    config = load_config(
        arch="sync", workers=2, rate_limit=100.0, rate_limit_per_key=1.0, api_keys="k-one-0123456789,k-two-0123456789"
    )
    assert shared_slot_count(config, 2) == 6
    slots = LocalSlots(6)
    first, second = Admission(config, ["b", "a"], slots), Admission(config, ["a", "b"], slots)
    first.charge("a")
    with pytest.raises(RateLimited) as info:
        second.charge("a")  # the same key's bucket, whichever process (here: object) holds it
    assert "rate limit of 1 requests/s" in info.value.message
    second.charge("b")
    assert first.limiter is not None and first.limiter.rate == 100.0  # exact, not split over the workers


def test_without_shared_slots_each_process_takes_an_even_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_STATE_ENV, raising=False)
    admission = Admission(load_config(arch="sync", workers=4, rate_limit=100.0))
    assert admission.limiter is not None and admission.limiter.rate == 25.0
