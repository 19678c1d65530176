"""A server answers while its models load (issue #41): live at once, not ready until loaded, in every architecture.

One server per architecture, its model's load() held until the test opens a gate (tests/models.py `LoadGate`):
while it loads the port answers, `/v2/health/live` and V1's `GET /` say 200, the readiness routes 503; a predict
waits for the load within its deadline (repository/residency.py, the wait a request for an evicted model makes):
past a short deadline it gets 504, and one sent before the gate opens is answered once the model has loaded. The
sync server serves a model repository (a version that fails to load is UNAVAILABLE and the others are ready), the
others MODEL arguments.
"""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

import httpx
import pytest

from tests.models import LOAD_GATE_ENV
from tests.serving import ROOT, ServerProcess, model_path, predict, wait_for_file, wait_until
from twinserve.lab.servers import http_ready

SOURCES = {"sync": "repository", "async": "models", "hybrid": "models"}


def _repository(root: Path) -> Path:
    """`loadgate` (held by the gate) and `broken` (its load fails) as a model repository."""
    for name, model in (("loadgate", "LoadGate"), ("broken", "FailsToLoad")):
        version = root / name / "1"
        version.mkdir(parents=True)
        (root / name / "twinserve.toml").write_text(f'model = "model.py:{model}"\n')
        (version / "model.py").write_text(f"from tests.models import {model} as {model}\n")
    return root


def _server(arch: str, tmp_path: Path, gate: Path) -> ServerProcess:
    """The server, started once it is live (its readiness is what the test watches)."""
    if SOURCES[arch] == "repository":
        served = ["--model-repository", str(_repository(tmp_path / "repository"))]
    else:
        served = [model_path("LoadGate")]
    args = [sys.executable, "-m", "twinserve", "serve", *served, "--arch", arch, "--host", "127.0.0.1"]
    args += ["--port", "0", "--workers", "1", "--model-workers", "1"]
    return ServerProcess(args, ready=http_ready("/v2/health/live"), env={LOAD_GATE_ENV: str(gate)}, cwd=ROOT)


@pytest.mark.parametrize("arch", list(SOURCES))
def test_live_while_the_models_load_ready_once_loaded(arch: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with (
        _server(arch, tmp_path, gate) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        wait_for_file(gate.with_suffix(".loading"), timeout=60)  # its load() runs (hybrid: in the model worker)
        get = client.get
        assert get("/v2/health/live").status_code == 200
        assert get("/").json() == {"status": "alive"}
        ready = get("/v2/health/ready")
        assert ready.status_code == 503 and ready.json()["ready"] is False, ready.text
        assert "loadgate" in ready.json()["loading"]  # (a repository's versions load one after another)
        model_ready = get("/v2/models/loadgate/ready")
        assert model_ready.status_code == 503 and model_ready.json() == {"name": "loadgate", "ready": False}
        assert model_ready.headers["retry-after"] == "1"
        status = get("/v1/models/loadgate")
        assert status.status_code == 503 and status.json()["ready"] is False

        waiting = pool.submit(predict, server, "loadgate", [1, 2], timeout=60)
        late = predict(server, "loadgate", [3], headers={"X-Request-Timeout-Ms": "300"})
        assert late.status_code == 504 and late.json()["code"] == "deadline_exceeded", late.text
        assert not waiting.done()  # still waiting for the load: it has no deadline of its own
        gate.touch()
        answered = waiting.result(timeout=60)
        assert answered.status_code == 200 and answered.json() == {"predictions": [1, 2]}, answered.text

        wait_until(lambda: get("/v2/health/ready").status_code == 200, 60, "the server to be ready")
        assert get("/v2/models/loadgate/ready").json() == {"name": "loadgate", "ready": True}
        assert get("/v1/models/loadgate").status_code == 200
        if SOURCES[arch] == "repository":  # a version that failed to load: unavailable, and the server ready
            states = {entry["name"]: entry["state"] for entry in client.post("/v2/repository/index").json()}
            assert states == {"broken": "UNAVAILABLE", "loadgate": "READY"}
