"""Faults under load: a killed HTTP worker, a killed model worker, a feature store that goes away and comes back.

What is promised, exactly:
- `kill -9` of a gunicorn worker (sync) or a uvicorn worker (async, --workers 2): the server starts a replacement
  and keeps serving on the other worker meanwhile. The requests the dead process had taken up lose their
  connection (closed or reset, with no response: what HTTP allows when a process dies); no request gets a 5xx, and
  at most one request per client connection fails.
- `kill -9` of a hybrid model worker: only the requests of the batch it was computing fail, each with 503
  `worker_died`; the pool replaces it; nothing fails at the transport.
- Redis stopped mid-load (the I/O example): requests get 503 `dependency_unavailable`, whose message names the
  store, with Retry-After; once Redis is back, requests succeed again, with no restart of the server.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ARCHS
from tests.live.hardening.harness import SLEEPY, RestartableRedis, Traffic
from tests.serving import HTTP, Server, wait_until
from twinserve.examples.io import populate

# serial: kills processes under load and counts what fails
pytestmark = pytest.mark.serial

CLIENTS = 8


def _sleepy(n: int) -> dict[str, Any]:
    return {"instances": [float(n)]}


def _http_workers(server: Server) -> set[int]:
    """The server's worker processes: its live children, less multiprocessing's resource tracker."""
    assert server.process is not None
    workers = set()
    for child in psutil.Process(server.process.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                workers.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return workers


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ["sync", "async", "hybrid"])
def test_killed_http_worker_is_replaced_and_only_its_requests_fail(arch: str) -> None:
    flags = ["--workers", "2", "--threads", "4", "--max-batch-size", "4", "--model-workers", "2"]
    with Server([SLEEPY], arch, *flags) as server:
        wait_until(lambda: len(_http_workers(server)) == 2, 60, "two HTTP workers")
        before = _http_workers(server)
        url = f"{server.url}/v1/models/sleepy:predict"
        with Traffic(url, _sleepy, CLIENTS) as traffic:
            traffic.wait_for(4 * CLIENTS)
            victim = min(before)
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            wait_until(
                lambda: len(_http_workers(server) - before) == 1 and victim not in _http_workers(server),
                60,
                "a replacement worker",
            )
            replaced = time.monotonic()
            traffic.wait_for(4 * CLIENTS, since=replaced)
        outcomes = traffic.outcomes
    statuses = Counter(o.status for o in outcomes if o.status is not None)
    failures = [o for o in outcomes if o.error is not None]
    print(
        f"{arch}: {dict(statuses)} answered, {len(failures)} lost their connection {Counter(o.error for o in failures)}"
    )
    assert set(statuses) == {200}, statuses
    assert all(o.at >= killed for o in failures), "a failure before the kill"
    assert all(o.error in ("RemoteProtocolError", "ReadError") for o in failures), failures
    assert len(failures) <= CLIENTS  # each client had at most one request in flight on the dead worker


@pytest.mark.hardening
def test_killed_model_worker_under_load_fails_only_its_batch() -> None:
    flags = ["--workers", "1", "--model-workers", "2", "--max-batch-size", "4"]
    with Server([SLEEPY], "hybrid", *flags) as server:
        model_url = f"{server.url}/v1/models/sleepy"
        before = HTTP.get(model_url).json()["serving"]["worker_pids"]
        with Traffic(f"{model_url}:predict", _sleepy, CLIENTS) as traffic:
            traffic.wait_for(4 * CLIENTS)
            os.kill(before[0], signal.SIGKILL)

            def replaced() -> bool:
                serving = HTTP.get(model_url).json()["serving"]
                return len(serving["worker_pids"]) == 2 and before[0] not in serving["worker_pids"]

            wait_until(replaced, 60, "a replacement model worker")
            traffic.wait_for(4 * CLIENTS, since=time.monotonic())
        assert HTTP.get(model_url).json()["serving"]["workers_replaced"] == 1
    outcomes = traffic.outcomes
    died = [o for o in outcomes if o.status == 503]
    statuses = Counter(o.status for o in outcomes)
    print(f"hybrid: {dict(statuses)}; worker_died: {len(died)}")
    assert set(statuses) <= {200, 503}, statuses  # no transport errors, no other status
    assert 1 <= len(died) <= 4  # the one batch (at most --max-batch-size requests of one instance) it was computing
    assert all(o.code == "worker_died" and str(before[0]) in o.message for o in died), died


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_redis_outage_is_503_naming_the_store_and_recovers(arch: str, tmp_path: Path) -> None:
    store = RestartableRedis(tmp_path)
    store.start()
    try:
        populate(store.url, entities=20)
        flags = ["--workers", "1", "--threads", "4", "--redis-url", store.url]
        with Server(["twinserve.examples.io:FeatureLookup"], arch, *flags) as server:
            url = f"{server.url}/v1/models/feature-lookup:predict"
            with Traffic(url, lambda n: {"instances": [{"entity_id": f"user:{n % 20}"}]}, 4) as traffic:
                traffic.wait_for(20)
                stopped = time.monotonic()
                store.stop()
                traffic.wait_for(10, since=stopped, status=503)
                restarted = time.monotonic()
                store.start()
                traffic.wait_for(20, since=restarted)
                back = time.monotonic()
                traffic.wait_for(20, since=back)
            outcomes = traffic.outcomes
    finally:
        store.stop()
    down = [o for o in outcomes if o.status != 200]
    print(f"{arch}: {len(outcomes)} requests, {len(down)} answered 503 while redis was down")
    assert all(o.status in (200, 503) for o in outcomes), Counter(o.status for o in outcomes)
    assert all(stopped <= o.at for o in down)
    assert all(o.code == "dependency_unavailable" and "redis" in o.message for o in down), down[:3]
    assert all(o.retry_after == "1" for o in down)
    late = [o for o in outcomes if o.at >= back and o.status != 200]
    assert not late, [(o.status, o.code, o.message) for o in late[:3]]  # what the store said, if it happens again
