"""`twinserve ray` against `twinserve serve --arch async`: a real local Ray (2 CPUs, 100 MB object store) serving
the tabular example with two replicas, checked from outside over HTTP like any client would."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.serving import Server, predict, scrape
from twinserve.cli import main
from twinserve.config import Config
from twinserve.deploy.ray import Scaling

pytestmark = pytest.mark.ray

MODEL = "twinserve.examples.tabular:Classifier"
MEMORY = "twinserve_process_resident_memory_bytes"


class RayServer(Server):
    """`twinserve ray MODEL --replicas 2` as a subprocess, bounded for a small machine."""

    def __init__(self, *extra: str) -> None:
        # Ray's session files and the replicas' metrics directories land here, where the test can check and remove
        # them (a short path: Ray's unix sockets live under it).
        self.tmp = Path(tempfile.mkdtemp(prefix="tsr-"))
        super().__init__([MODEL], "async", env={"TMPDIR": str(self.tmp)})
        self.args = [sys.executable, "-m", "twinserve", "ray", MODEL, "--port", str(self.port), "--num-cpus", "2"]
        self.args += extra

    def tree(self) -> list[psutil.Process]:
        """Every process this server started (Ray's own daemons and its workers descend from it)."""
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def _stop_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def test_scaling_options() -> None:
    config = Config(arch="async", max_queue=200)
    fixed = Scaling(replicas=3).options(config)
    assert fixed["num_replicas"] == 3
    assert "autoscaling_config" not in fixed
    # Ray must not cap a replica's concurrency below what its batcher and admission control expect.
    assert fixed["max_ongoing_requests"] == 200
    auto = Scaling(autoscale=(1, 4)).options(config)
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 1,
        "target_ongoing_requests": config.effective_max_batch_size,
    }
    assert Scaling(autoscale=(0, 2), target_ongoing=8).options(config)["autoscaling_config"]["min_replicas"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arch", "sync"], "--arch: Ray replicas run the async front"),
        (["--workers", "2"], "--workers: each Ray replica is one server process"),
        (["--target-ongoing", "4"], "--target-ongoing needs --autoscale"),
        (["--max-batch-size", "0"], "--max-batch-size"),
    ],
)
def test_cli_refuses_what_ray_cannot_serve(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ray", MODEL, *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def ray_server() -> Iterator[RayServer]:
    server = RayServer("--replicas", "2").start()
    started = server.tree()
    try:
        yield server
    finally:
        leftovers = [*started, *server.tree()]
        server.stop()
        _stop_all([p for p in leftovers if p.is_running()])
        shutil.rmtree(server.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def async_server() -> Iterator[Server]:
    with Server([MODEL], "async") as server:
        yield server


def _replica_pids(server: Server, scrapes: int = 1) -> set[str]:
    """The pids of the replicas that answered `scrapes` scrapes (each replica exports its own memory gauge)."""
    pids: set[str] = set()
    for _ in range(scrapes):
        pids |= {dict(labels)["pid"] for (name, labels) in scrape(server) if name == MEMORY}
    return pids


def _examples(server: Server) -> list[Any]:
    examples: list[Any] = httpx.get(f"{server.url}/v1/models/iris", timeout=30).json()["examples"]
    return examples


def test_predictions_equal_async(ray_server: RayServer, async_server: Server) -> None:
    instances = _examples(async_server)
    assert instances
    for batch in (instances[:1], instances):
        on_ray, on_async = predict(ray_server, "iris", batch), predict(async_server, "iris", batch)
        assert on_ray.status_code == on_async.status_code == 200
        assert on_ray.json() == on_async.json()
        assert on_ray.headers["content-type"] == on_async.headers["content-type"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [("/v1/models/iris:predict", b'{"instances": 3}', 422), ("/v1/models/nope:predict", b'{"instances": []}', 404)],
)
def test_error_bodies_equal_async(
    ray_server: RayServer, async_server: Server, path: str, body: bytes, status: int
) -> None:
    headers = {"content-type": "application/json", "x-request-id": "same-id-for-both"}
    on_ray = httpx.post(ray_server.url + path, content=body, headers=headers, timeout=30)
    on_async = httpx.post(async_server.url + path, content=body, headers=headers, timeout=30)
    assert on_ray.status_code == on_async.status_code == status
    assert on_ray.content == on_async.content
    assert on_ray.headers.get_list("x-request-id") == on_async.headers.get_list("x-request-id") == ["same-id-for-both"]


def test_request_id_is_made_once(ray_server: RayServer) -> None:
    response = httpx.post(ray_server.url + "/v1/models/nope:predict", json={"instances": []}, timeout=30)
    assert response.status_code == 404
    assert response.headers.get_list("x-request-id") == [response.json()["error"]["request_id"]]


def test_metrics_names_equal_async(ray_server: RayServer, async_server: Server) -> None:
    for server in (ray_server, async_server):
        for _ in range(10):  # enough for each replica to see one of each
            predict(server, "iris", _examples(async_server)[:1])
            httpx.get(server.url + "/v1/models/nope", timeout=30)
    # Each replica exports its own samples: together they must name exactly what the async server does.
    on_ray = {name for _ in range(20) for name, _ in scrape(ray_server)}
    assert on_ray == {name for name, _ in scrape(async_server)}


def test_requests_spread_over_both_replicas(ray_server: RayServer) -> None:
    assert len(_replica_pids(ray_server, scrapes=30)) == 2


def test_killed_replica_is_replaced(ray_server: RayServer, async_server: Server) -> None:
    instances = _examples(async_server)[:1]
    before = _replica_pids(ray_server, scrapes=30)
    victim = before.pop()
    os.kill(int(victim), signal.SIGKILL)
    answered = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # Requests routed to the dead replica before Ray notices may fail; the app as a whole keeps answering.
        answered += predict(ray_server, "iris", instances).status_code == 200
        pids = _replica_pids(ray_server, scrapes=4)
        if victim not in pids and len(pids) == 2 and answered >= 5:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"replica {victim} was not replaced within 60 s (answered {answered})")
    assert all(predict(ray_server, "iris", instances).status_code == 200 for _ in range(20))


def test_sigterm_exits_zero_and_leaves_no_ray_process(ray_server: RayServer) -> None:
    processes = ray_server.tree()
    assert any(p.name() == "raylet" for p in processes)
    ray_server.terminate()
    assert ray_server.process is not None
    assert ray_server.process.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    # The killed replica's directory stays (it had no chance to clean up); every replica stopped by Ray removes its own.
    assert len(list(ray_server.tmp.glob("twinserve-metrics-*"))) <= 1
