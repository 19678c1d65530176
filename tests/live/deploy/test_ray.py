"""`twinserve ray` against `twinserve serve --arch async`: a real local Ray (2 CPUs, 100 MB object store) serving
the tabular example and a gated test model with two replicas, checked from outside over HTTP like any client would.

One Ray deployment serves the whole module (Ray starts slowly); `serve` runs with the same models and flags."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as triton

from tests.errors import error_fields
from tests.serving import HTTP, ROOT, Server, ServerProcess, free_port, model_path, poll, predict, scrape
from twinserve.cli import main
from twinserve.config import Config
from twinserve.core.heap import YOUNG_THRESHOLD
from twinserve.deploy.ray import Scaling, _replica_config, replica_capacity

pytestmark = pytest.mark.ray

MODEL = "twinserve.examples.tabular:Classifier"
GATE = model_path("Gate")
HEAP = model_path("HeapState")
MEMORY = "twinserve_process_resident_memory_bytes"
#: Both servers: one request computed at a time per process, and room for 3 queued instances (the tabular example's
#: three examples fit in one request), so a flood of gated requests overflows them deterministically.
QUEUE = 3
FLAGS = ("--max-batch-size", "1", "--model-workers", "1", "--max-queue", str(QUEUE))


class RayServer(ServerProcess):
    """`twinserve ray MODEL... --replicas 2` as a subprocess, bounded for a small machine."""

    def __init__(self, *extra: str, models: tuple[str, ...] = (MODEL, GATE, HEAP)) -> None:
        # Ray's session files and the replicas' metrics directories land here, where the test can check and remove
        # them (a short path: Ray's unix sockets live under it).
        self.tmp = Path(tempfile.mkdtemp(prefix="tsr-"))
        port = free_port()  # Ray's proxy binds the port it is given and says no other
        args = [sys.executable, "-m", "twinserve", "ray", *models, "--port", str(port)]
        super().__init__(args, port=port, env={"TMPDIR": str(self.tmp)}, cwd=ROOT)
        self.args += ["--num-cpus", "2", *FLAGS, *extra]

    def tree(self) -> list[psutil.Process]:
        """Every process this server started (Ray's own daemons and its workers descend from it)."""
        assert self.process is not None
        try:
            found: list[psutil.Process] = psutil.Process(self.process.pid).children(recursive=True)
            return found
        except psutil.NoSuchProcess:
            return []


def _stop_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def test_scaling_options() -> None:
    config = Config(arch="async", models=[MODEL], max_queue=200, model_workers=2, max_batch_size=16)
    fixed = Scaling(replicas=3).options(config)
    assert fixed["num_replicas"] == 3
    assert "autoscaling_config" not in fixed
    # Ray must send a full replica more requests than its batcher holds (200 queued + 2 x 16 computing), so that
    # twinserve's own admission, not Ray's proxy, answers the excess.
    assert fixed["max_ongoing_requests"] == replica_capacity(config) == 200 + 2 * 2 * 16
    assert replica_capacity(config.model_copy(update={"models": [MODEL, GATE]})) == 2 * (200 + 2 * 2 * 16)
    assert "max_queued_requests" not in fixed  # Ray's default: the proxy holds requests while no replica can
    bounded = Scaling(max_queued_requests=50).options(config)
    assert bounded["max_queued_requests"] == 50
    assert bounded["backpressure_config"] == {"status_code": 503, "retry_after_s": 1}
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
    with Server([MODEL, GATE, HEAP], "async", *FLAGS) as server:
        yield server


def _replica_pids(server: ServerProcess, scrapes: int = 1) -> set[str]:
    """The pids of the replicas that answered `scrapes` scrapes (each replica exports its own memory gauge)."""
    pids: set[str] = set()
    for _ in range(scrapes):
        pids |= {dict(labels)["pid"] for (name, labels) in scrape(server) if name == MEMORY}
    return pids


def _examples(server: ServerProcess) -> list[Any]:
    examples: list[Any] = HTTP.get(f"{server.url}/v1/models/iris", timeout=30).json()["examples"]
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
    on_ray = HTTP.post(ray_server.url + path, content=body, headers=headers, timeout=30)
    on_async = HTTP.post(async_server.url + path, content=body, headers=headers, timeout=30)
    assert on_ray.status_code == on_async.status_code == status
    assert on_ray.content == on_async.content
    assert on_ray.headers.get_list("x-request-id") == on_async.headers.get_list("x-request-id") == ["same-id-for-both"]


def test_each_replica_freezes_what_it_loaded(ray_server: RayServer) -> None:
    """core/heap.py: a replica's heap settles once its models have loaded, as a server process's does."""
    states = [predict(ray_server, "heap", [1]).json()["predictions"][0] for _ in range(12)]
    assert all(state["frozen"] for state in states), states
    assert {state["young_threshold"] for state in states} == {YOUNG_THRESHOLD}


def test_request_id_is_made_once(ray_server: RayServer) -> None:
    response = HTTP.post(ray_server.url + "/v1/models/nope:predict", json={"instances": []}, timeout=30)
    assert response.status_code == 404
    assert response.headers.get_list("x-request-id") == [error_fields(response.json())["request_id"]]


def test_metrics_names_equal_async(ray_server: RayServer, async_server: Server) -> None:
    for server in (ray_server, async_server):
        for _ in range(10):  # enough for each replica to see one of each
            predict(server, "iris", _examples(async_server)[:1])
            HTTP.get(server.url + "/v1/models/nope", timeout=30)
    # Each replica exports its own samples: together they must name exactly what the async server does.
    on_ray = {name for _ in range(20) for name, _ in scrape(ray_server)}
    assert on_ray == {name for name, _ in scrape(async_server)}


# -- the Open Inference Protocol (V2) ------------------------------------------------------------------------------
FLOWERS = [[5.1, 3.5, 1.4, 0.2], [6.4, 3.2, 4.5, 1.5], [6.3, 3.3, 6.0, 2.5]]


def _fp32(rows: list[list[float]], name: str = "input", datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [len(rows), len(rows[0])], "data": rows}


@pytest.mark.parametrize(
    "path", ["/v2", "/v2/models/iris", "/v2/models/iris/versions/1", "/v2/models/gate", "/v2/models/iris/config"]
)
def test_v2_metadata_equal_async(ray_server: RayServer, async_server: Server, path: str) -> None:
    on_ray, on_async = (HTTP.get(s.url + path, timeout=30) for s in (ray_server, async_server))
    assert on_ray.status_code == on_async.status_code == 200
    assert on_ray.content == on_async.content


@pytest.mark.parametrize(
    ("model", "body", "status"),
    [
        ("iris", {"id": "fp32", "inputs": [_fp32(FLOWERS)]}, 200),
        ("iris", {"inputs": [_fp32(FLOWERS[:1])], "outputs": [{"name": "class_id"}]}, 200),
        ("iris", {"inputs": [_fp32([[1.0, 2.0, 3.0]])]}, 400),  # wrong shape
        ("iris", {"inputs": [_fp32(FLOWERS[:1], datatype="FP64")]}, 400),
        ("iris", {"inputs": [_fp32([[1.0, 2.0, 3.0, -4.0]])]}, 422),  # the model's own validation
        ("nope", {"inputs": [_fp32(FLOWERS[:1])]}, 404),
    ],
)
def test_v2_infer_equal_async(
    ray_server: RayServer, async_server: Server, model: str, body: dict[str, Any], status: int
) -> None:
    headers = {"x-request-id": "same-v2-id"}
    url = f"/v2/models/{model}/infer"
    on_ray, on_async = (
        HTTP.post(s.url + url, json=body, headers=headers, timeout=30) for s in (ray_server, async_server)
    )
    assert on_ray.status_code == on_async.status_code == status, (on_ray.text, on_async.text)
    assert on_ray.headers["content-type"] == on_async.headers["content-type"]
    assert on_ray.content == on_async.content
    if status >= 400:
        assert list(on_ray.json()) == ["error"]


def test_v2_binary_tensors_through_tritonclient_equal_async(ray_server: RayServer, async_server: Server) -> None:
    results = []
    for server in (ray_server, async_server):
        with triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30) as client:
            tensor = triton.InferInput("input", [3, 4], "FP32")
            tensor.set_data_from_numpy(np.array(FLOWERS, dtype=np.float32), binary_data=True)
            results.append(client.infer("iris", [tensor], request_id="binary-1"))
    on_ray, on_async = results
    assert on_ray.get_response() == on_async.get_response()
    for name in ("label", "class_id", "probabilities"):
        np.testing.assert_array_equal(on_ray.as_numpy(name), on_async.as_numpy(name))
    assert on_ray.as_numpy("class_id").tolist() == [0, 1, 2]


# -- backpressure ----------------------------------------------------------------------------------------------
def _flood(server: ServerProcess, gates: Path, requests: int, processes: int, exact: bool = True) -> set[bytes]:
    """`requests` concurrent gated requests to a server of `processes` replicas or workers: once each process is
    computing one, each queues QUEUE more and rejects the rest with twinserve's 503 at once; released, every
    accepted one is answered. Returns the rejections' distinct bodies.

    Not `exact` (Ray): the router spreads requests by its own estimate of each replica's load, so one replica
    may be handed more than its queue holds while the other has room: more may be rejected, never fewer."""
    held = processes * (1 + QUEUE)
    url = f"{server.url}/v1/models/gate:predict"
    headers = {"x-request-id": "flood"}  # one id for all: every rejection's body is then the same
    started = [gates / str(i) / "gate.started" for i in range(requests)]

    def gated(i: int) -> httpx.Response:
        started[i].parent.mkdir(parents=True, exist_ok=True)
        body = {"instances": [{"gate": str(started[i].with_suffix(""))}]}
        return HTTP.post(url, json=body, headers=headers, timeout=90)

    with ThreadPoolExecutor(requests) as pool:
        # One computing in each process first (else a burst can fill a queue before a batch leaves it). Ray's
        # router may hand the second request to the replica already computing, where it waits behind the gate (it
        # did once in CI): so requests go one at a time until a gate has started in every process.
        futures: list[Future[httpx.Response]] = []
        computing: set[str] = set()
        while len(computing) < processes:
            assert len(futures) < requests, f"gates started in {len(computing)} of {processes} processes"
            futures.append(pool.submit(gated, len(futures)))
            path = started[len(futures) - 1]
            poll(partial(_started_or_answered, path, futures[-1]), 60 if not computing else 5, interval=0.01)
            if pid := _read(path):
                computing.add(pid)
        futures += [pool.submit(gated, i) for i in range(len(futures), requests)]
        deadline = time.monotonic() + 60
        while sum(f.done() for f in futures) < requests - held:
            assert time.monotonic() < deadline, f"{sum(f.done() for f in futures)} of {requests} answered"
            time.sleep(0.01)  # polling the futures while the gates hold the accepted ones
        rejected = [f.result() for f in futures if f.done()]
        for path in started:
            path.with_suffix(".release").touch()
        responses = [f.result() for f in futures]
    if exact:
        assert len(rejected) == requests - held, [r.status_code for r in rejected]
    for response in rejected:
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == "application/json"
        assert error_fields(response.json())["code"] == "queue_full"
    accepted = [r for r in responses if r.status_code != 503]
    assert len(accepted) == held if exact else 0 < len(accepted) <= held
    assert len(accepted) + len(rejected) == requests  # no request was rejected after its gate opened
    assert all(r.status_code == 200 and r.json() == {"predictions": ["released"]} for r in accepted)
    return {r.content for r in rejected}


def _read(path: Path) -> str:
    """The file's text, or "" while it is missing (the gate writes its process id when it starts)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _started_or_answered(gate: Path, future: Future[httpx.Response]) -> bool:
    """Whether the gate's request is computing (it wrote its process id) or was answered already (refused)."""
    return bool(_read(gate)) or future.done()


def test_backpressure_gives_twinserves_503_like_serve(
    ray_server: RayServer, async_server: Server, tmp_path: Path
) -> None:
    on_serve = _flood(async_server, tmp_path / "serve", 12, 1)
    on_ray = _flood(ray_server, tmp_path / "ray", 12, 2, exact=False)  # each replica holds 1 + QUEUE, rejects the rest
    # One id, one queue state: the very same rejection from both, so a client cannot tell Ray from serve.
    assert len(on_ray) == 1
    assert on_ray == on_serve
    for server in (async_server, ray_server):  # and both serve normally afterwards
        assert predict(server, "iris", _examples(async_server)).status_code == 200


def test_max_queued_requests_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        main(["ray", MODEL, "--max-queued-requests", "0"])


def test_requests_spread_over_both_replicas(ray_server: RayServer) -> None:
    # Concurrent scrapes, so that the router, which prefers the replica it last saw idle, must use both.
    seen: set[str] = set()
    with ThreadPoolExecutor(8) as pool:
        for _ in range(10):
            for pids in pool.map(lambda _: _replica_pids(ray_server), range(8)):
                seen |= pids
            if len(seen) == 2:
                break
    assert len(seen) == 2


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


# -- a model repository ---------------------------------------------------------------------------------------
SCALER = (
    "from pathlib import Path\n\n\nclass Scaler:\n    def load(self):\n"
    "        self.factor = int((Path(__file__).parent / 'factor.txt').read_text())\n\n"
    "    def predict(self, batch):\n        return [x * self.factor for x in batch]\n"
)


def _add_version(model: Path, number: int) -> None:
    """A version folder written beside the model and moved in, as a poll must see it (docs/repository.md)."""
    staging = model.parent / f".staging-{number}"
    staging.mkdir()
    (staging / "model.py").write_text(SCALER)
    (staging / "factor.txt").write_text(str(number * 10))
    staging.rename(model / str(number))


def _repository(root: Path) -> Path:
    """`scaler` in versions 1 and 2 with its own queue; `flat` (version 1)."""
    (root / "scaler").mkdir(parents=True)
    (root / "scaler" / "twinserve.toml").write_text('model = "model.py:Scaler"\n[settings]\nmax_queue = 7\n')
    for number in (1, 2):
        _add_version(root / "scaler", number)
    (root / "flat").mkdir()
    (root / "flat" / "twinserve.toml").write_text('model = "model.py:Scaler"\n')
    (root / "flat" / "model.py").write_text(SCALER)
    (root / "flat" / "factor.txt").write_text("1")
    return root


def test_replica_capacity_counts_every_version_with_its_own_settings(tmp_path: Path) -> None:
    config = Config(arch="async", model_repository=_repository(tmp_path), max_queue=200, max_batch_size=16)
    per_batcher = 2 * 1 * 16  # two batches of 16 in flight per model worker
    # scaler: two versions, each with its own queue of 7; flat: one version with the server's 200.
    assert replica_capacity(config) == 2 * (7 + per_batcher) + (200 + per_batcher)
    # What a replica is handed (as JSON) validates there, with the repository at its absolute path.
    moved = os.getcwd()
    os.chdir(tmp_path)
    try:
        relative = config.model_copy(update={"model_repository": Path("scaler").parent})
        replica = Config.model_validate_json(_replica_config([], relative).model_dump_json())
    finally:
        os.chdir(moved)
    assert replica.model_repository == tmp_path and replica.model_repository.is_absolute()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([MODEL], "MODEL arguments and --model-repository are exclusive"),
        (["--model-control", "explicit", "--replicas", "2"], "--model-control explicit: a load or unload would"),
        (["--model-control", "explicit", "--autoscale", "1,2"], "--model-control explicit"),
    ],
)
def test_cli_refuses_what_a_repository_on_ray_cannot_mean(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ray", "--model-repository", str(_repository(tmp_path)), *argv]) == 2
    assert message in capsys.readouterr().err


#: A replica's app built and driven in a process of its own, without Ray (it sets the process's logging and
#: metrics directory, as a replica process would): the answers of the paths given, and the repository index.
REPLICA = """
import json, sys
from starlette.testclient import TestClient
from twinserve.config import Config
from twinserve.deploy.ray import TwinserveReplica, _replica_config

config = _replica_config([], Config(arch="async", model_repository=sys.argv[1], log_level="warning"))
app = TwinserveReplica(config.model_dump_json(), ".").__serve_build_asgi_app__()
with TestClient(app, base_url="http://127.0.0.1") as client:
    out = {p: client.post(p, json={"instances": [1]}).json()["predictions"][0] for p in sys.argv[2:]}
    out["index"] = client.post("/v2/repository/index").json()
print(json.dumps(out))
"""


def test_a_replica_builds_the_servers_registry_over_a_repository(tmp_path: Path) -> None:
    """What each replica runs, checked in seconds; the real Ray test below runs it under Ray Serve."""
    paths = ["/v1/models/scaler:predict", "/v1/models/scaler/versions/1:predict", "/v1/models/flat:predict"]
    done = subprocess.run(
        [sys.executable, "-c", REPLICA, str(_repository(tmp_path)), *paths],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout.splitlines()[-1])
    assert [answers[p] for p in paths] == [20, 10, 1]  # the default is the highest version
    assert {(e["name"], e["version"], e["state"]) for e in answers["index"]} == {
        ("flat", "1", "READY"), ("scaler", "1", "READY"), ("scaler", "2", "READY")
    }  # fmt: skip


def _scaled(server: ServerProcess, path: str) -> Any:
    answer = HTTP.post(f"{server.url}{path}", json={"instances": [1]}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"][0]


def test_a_model_repository_serves_every_model_and_version_and_follows_the_folder(tmp_path: Path) -> None:
    """After the module's Ray is gone (the test above stops it): one replica over a repository, under poll."""
    repository = _repository(tmp_path / "repo")
    argv = ("--model-repository", str(repository), "--model-control", "poll", "--repository-poll-s", "0.5")
    server = RayServer("--replicas", "1", *argv, models=()).start()
    started = server.tree()
    try:
        assert _scaled(server, "/v1/models/scaler:predict") == 20  # the default: the highest version
        assert _scaled(server, "/v1/models/scaler/versions/1:predict") == 10
        assert _scaled(server, "/v1/models/flat:predict") == 1
        index = HTTP.post(f"{server.url}/v2/repository/index", timeout=30).json()
        assert {(e["name"], e["version"], e["state"]) for e in index} == {
            ("flat", "1", "READY"), ("scaler", "1", "READY"), ("scaler", "2", "READY")
        }  # fmt: skip
        _add_version(repository / "scaler", 3)
        deadline = time.monotonic() + 120
        while _scaled(server, "/v1/models/scaler:predict") != 30:
            assert time.monotonic() < deadline, "the replica did not load version 3 within 120 s"
            time.sleep(0.5)
        assert _scaled(server, "/v1/models/scaler/versions/2:predict") == 20  # the others still serve
    finally:
        leftovers = [*started, *server.tree()]
        server.stop()
        _stop_all([p for p in leftovers if p.is_running()])
        shutil.rmtree(server.tmp, ignore_errors=True)
