"""`/metrics` in every architecture: same names, exact counts across worker processes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.serving import HTTP, Server, model_path, poll, predict, sample, scrape, wait_until
from twinserve.observability.metrics import metrics, reap_dead_processes

#: The models of the module's shared servers: in hybrid each server process has a model-worker pool per model.
METERED_MODELS = (model_path("Echo"), model_path("Faulty"))


@pytest.fixture(scope="module", params=ARCHS)
def metered(request: pytest.FixtureRequest) -> Iterator[Server]:
    """One server per architecture, two worker processes, for the tests that only send requests and read
    `/metrics`: each counts what it sent as the difference between a scrape before and one after."""
    with Server(METERED_MODELS, request.param, "--workers", "2", "--max-body-bytes", "1000") as started:
        yield started


def test_every_request_is_counted_once_whichever_worker_answered(metered: Server) -> None:
    server = metered
    before = scrape(server)
    requests = 40
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: predict(server, "echo", [i, -i]), range(requests)))
    assert all(a.status_code == 200 for a in answers)
    assert predict(server, "faulty", ["boom"]).status_code == 500
    assert predict(server, "echo", ["x" * 2000]).status_code == 413
    assert HTTP.get(server.url + "/v1/nothing").status_code == 404
    samples = scrape(server)

    def get(name: str, **labels: str) -> float:
        return sample(samples, name, **labels)

    def added(name: str, **labels: str) -> float:
        """The counter's growth over this test: the server is shared by the module's tests."""
        return sample(samples, name, **labels) - sample(before, name, **labels)

    assert added("twinserve_requests_total", model="echo", endpoint="predict", code="200") == requests
    assert added("twinserve_requests_total", model="echo", endpoint="predict", code="413") == 1
    assert added("twinserve_requests_total", model="faulty", endpoint="predict", code="500") == 1
    assert added("twinserve_requests_total", model="", endpoint="unknown", code="404") == 1
    assert added("twinserve_rejected_requests_total", model="echo", reason="body_too_large") == 1
    latency = dict(model="echo", endpoint="predict")
    assert added("twinserve_request_duration_seconds_count", **latency) == requests + 1
    assert added("twinserve_request_duration_seconds_bucket", le="+Inf", **latency) == requests + 1
    assert added("twinserve_request_duration_seconds_sum", **latency) > 0
    # every instance was computed exactly once, in however many batches
    assert added("twinserve_batch_size_sum", model="echo") == 2 * requests
    assert 1 <= added("twinserve_batch_size_count", model="echo") <= requests
    assert added("twinserve_queue_wait_seconds_count", model="echo") == requests
    assert added("twinserve_inference_duration_seconds_count", model="echo") == added(
        "twinserve_batch_size_count", model="echo"
    )
    assert get("twinserve_model_load_seconds_count", model="echo", version="1") >= 1
    assert get("twinserve_in_flight_requests") == 0  # every request answered; a scrape is not counted


def test_memory_is_reported_per_process_with_its_role(metered: Server) -> None:
    server = metered
    # Two server processes; in hybrid, each with one model worker (the default) for each model.
    model_workers = 2 * len(METERED_MODELS) if server.arch == "hybrid" else 0
    expected = sorted(["server"] * 2 + ["model_worker"] * model_workers)
    seen: dict[str, Any] = {}

    def every_process_reported() -> bool:
        samples = seen["samples"] = scrape(server)
        per_process = seen["per_process"] = {
            dict(labels)["pid"]: (dict(labels)["role"], value)
            for (name, labels), value in samples.items()
            if name == "twinserve_process_resident_memory_bytes"
        }
        # A process's gauge exists (at 0) from its first moment; it reads its RSS once sampled.
        roles = sorted(role for role, _ in per_process.values())
        return roles == expected and all(value > 0 for _, value in per_process.values())

    poll(every_process_reported, 60, 0.1)  # ready means one worker answers; wait until every process has reported
    samples, per_process = seen["samples"], seen["per_process"]
    assert sorted(role for role, _ in per_process.values()) == expected
    assert all(value > 10 * 2**20 for _, value in per_process.values())  # a Python process holds > 10 MiB
    total = sample(samples, "twinserve_resident_memory_bytes")
    assert total == pytest.approx(sum(value for _, value in per_process.values()), rel=0.1)


def test_a_killed_uvicorn_workers_gauges_leave_the_aggregate() -> None:
    """SIGKILL skips the lifespan shutdown that marks a worker dead: the survivors must notice instead."""

    def server_pids(server: Server) -> set[int]:
        return {
            int(dict(labels)["pid"])
            for (name, labels), _ in scrape(server).items()
            if name == "twinserve_process_resident_memory_bytes"
        }

    def wait_for(server: Server, condition: Callable[[set[int]], bool], timeout: float = 60.0) -> set[int]:
        seen: set[int] = set()

        def met() -> bool:
            try:
                pids = server_pids(server)
            except httpx.TransportError:  # the scrape reached the worker as it died
                pids = set()
            seen.clear()
            seen.update(pids)
            return condition(pids)

        if not poll(met, timeout, 0.1):
            raise AssertionError(f"the /metrics pids never met the condition; last seen: {sorted(seen)}")
        return set(seen)

    with Server([model_path("Echo")], "async", "--workers", "2") as server:
        before = wait_for(server, lambda pids: len(pids) == 2)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        after = wait_for(server, lambda pids: victim not in pids and len(pids) == 2)
    assert len(after - before) == 1  # uvicorn's replacement, and no sample of the dead worker left


@pytest.mark.parametrize("arch", ARCHS)
def test_a_killed_worker_is_counted_as_one_death(arch: str) -> None:
    """SIGKILL an HTTP worker (sync, async) or a model worker (hybrid): `twinserve_worker_deaths_total` counts it
    once, whether gunicorn's arbiter, a surviving worker's reaper or the model-worker pool noticed it first."""
    role = "model_worker" if arch == "hybrid" else "server"
    flags = ["--model-workers", "2"] if arch == "hybrid" else ["--workers", "2"]

    def pids(server: Server) -> set[int]:
        samples = scrape(server)
        return {
            int(dict(labels)["pid"])
            for (name, labels), _ in samples.items()
            if name == "twinserve_process_resident_memory_bytes" and dict(labels)["role"] == role
        }

    def wait_for(server: Server, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        def met() -> bool:
            with contextlib.suppress(httpx.TransportError):  # a scrape may reach the worker as it dies
                return condition()
            return False

        wait_until(met, timeout, what, interval=0.1)

    def deaths(server: Server) -> float:
        return sample(scrape(server), "twinserve_worker_deaths_total")

    with Server([model_path("Echo")], arch, *flags) as server:
        wait_for(server, lambda: len(pids(server)) == 2, "two worker processes")
        assert deaths(server) == 0
        victim = min(pids(server))
        os.kill(victim, signal.SIGKILL)
        wait_for(server, lambda: victim not in pids(server) and deaths(server) == 1, "the death counted")
        # Traffic reaches the dead model worker's slot (hybrid replaces it then): still one death.
        statuses = {predict(server, "echo", [i]).status_code for i in range(6)}
        assert statuses <= {200, 503}
        wait_for(server, lambda: len(pids(server)) == 2, "a replacement")
        assert deaths(server) == 1


def test_reaping_drops_only_the_live_gauges_of_dead_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(finished.stdout), os.getpid()  # the child has exited and been waited for
    files = [f"gauge_liveall_{dead}.db", f"gauge_livesum_{dead}.db", f"counter_{dead}.db", f"gauge_max_{dead}.db"]
    files += [f"gauge_liveall_{alive}.db", f"histogram_{alive}.db"]
    for name in files:
        (tmp_path / name).write_bytes(b"")
    metrics()  # made before the directory is set: this process counts in memory, not in its files
    counted = _deaths()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    assert reap_dead_processes() == [dead]
    # Counters, histograms and max gauges outlive their process; only its live gauges go.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files[2:])
    assert reap_dead_processes() == []
    assert _deaths() == counted + 1  # counted once, by whoever removed its gauges first


def _deaths() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("twinserve_worker_deaths_total") or 0.0
