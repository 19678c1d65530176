"""Start-up, shutdown and the debug path, per architecture, on real servers."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from tests.conftest import ARCHS
from tests.serving import HTTP, Server, model_path, predict, wait_for_file
from twinserve.core.heap import YOUNG_THRESHOLD

#: What each server logs once it has begun a graceful shutdown.
SHUTDOWN_STARTED = {"sync": "Handling signal: term", "async": "Shutting down", "hybrid": "Shutting down"}


@pytest.mark.parametrize("arch", ARCHS)
def test_sigterm_lets_in_flight_requests_finish(arch: str, tmp_path: Path) -> None:
    server = Server(
        [model_path("Gate")],
        arch,
        "--workers",
        "1",
        "--threads",
        "4",
        "--model-workers",
        "4",
        "--max-batch-size",
        "1",
        "--graceful-timeout",
        "60",
    )
    with server, concurrent.futures.ThreadPoolExecutor(4) as pool:
        gates = [tmp_path / f"request{i}" for i in range(4)]
        pending = [pool.submit(predict, server, "gate", [{"gate": str(g)}]) for g in gates]
        for gate in gates:
            wait_for_file(gate.with_suffix(".started"))
        server.terminate()
        server.wait_for_output(SHUTDOWN_STARTED[arch])
        for gate in gates:
            gate.with_suffix(".release").touch()
        responses = [p.result(timeout=60) for p in pending]
        assert [r.status_code for r in responses] == [200] * 4
        assert all(r.json() == {"predictions": ["released"]} for r in responses)
        assert server.process is not None
        assert server.process.wait(timeout=60) == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_every_serving_process_freezes_what_it_loaded(arch: str) -> None:
    """core/heap.py: once its models have loaded, a serving process (sync: each gunicorn worker; async: the uvicorn
    process; hybrid: each model worker) freezes what it holds, out of every later collection's walk, and collects
    its youngest generation less often."""
    with Server([model_path("HeapState")], arch, "--workers", "2", "--model-workers", "2") as server:
        states = [predict(server, "heap", [1]).json()["predictions"][0] for _ in range(8)]
    assert all(state["frozen"] for state in states), states
    assert {state["young_threshold"] for state in states} == {YOUNG_THRESHOLD}


@pytest.mark.parametrize("arch", ["sync", "async"])  # hybrid's model workers are processes: no --debug
def test_debug_serves_from_the_main_thread(arch: str) -> None:
    with Server([model_path("WhereAmI"), model_path("Echo")], arch, "--debug") as server:
        where = predict(server, "where", [1]).json()["predictions"][0]
        assert where["main"] is True  # so breakpoint() in the model stops in the foreground terminal
        assert predict(server, "echo", [1, 2]).json() == {"predictions": [1, 2]}
        assert predict(server, "nope", [1]).status_code == 404


def test_sync_worker_class_handles_requests_in_the_worker_main_thread() -> None:
    with Server([model_path("WhereAmI")], "sync", "--worker-class", "sync", "--workers", "2") as server:
        answers = [predict(server, "where", [1]).json()["predictions"][0] for _ in range(6)]
        assert all(a["main"] for a in answers)


def test_default_model_is_the_tabular_example() -> None:
    with Server([], "async") as server:
        assert HTTP.get(server.url + "/v1/models").json()["models"] == ["iris"]
