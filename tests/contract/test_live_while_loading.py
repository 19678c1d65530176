"""The fronts answer while the models load (issue #41), in process: the sync app (`build_wsgi_app` with a load
failure handler, as each gunicorn worker builds it) and the async app (`create_asgi_app` with one, as uvicorn's app
factory builds it), over a model whose load() waits for a file (tests/models.py `LoadGate`).

While it loads: live 200, ready and the model's ready routes 503 with `Retry-After`, a predict waits for the load
(or, past its deadline, 504); once loaded, ready. A model of the MODEL arguments that fails to load goes to the
failure handler (the server's to report and stop), the app is never ready, and a predict meanwhile gets 503
`model_unavailable` at once; told to stop while a model loads, the async app's lifespan ends without waiting for the
load. The real servers: tests/live/test_live_while_loading.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.models import LOAD_GATE_ENV
from tests.serving import model_path, wait_for_file, wait_until
from twinserve.config import Config, load_config
from twinserve.fronts.asgi import create_asgi_app
from twinserve.repository import ModelRegistry
from twinserve.servers.served import Served
from twinserve.servers.sync import server
from twinserve.service.contract import Service


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "gate"
    monkeypatch.setenv(LOAD_GATE_ENV, str(path))
    yield path
    path.touch()  # a load still waiting ends (its thread is a daemon: the test does not wait for it)


def in_flight(exposition: str) -> float:
    """`twinserve_in_flight_requests` in a /metrics answer (scrapes and probes are not counted)."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "twinserve_in_flight_requests":
                return float(sample.value)
    return 0.0


class _Failures:
    """The load failure handler: what it was given, and when."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.called = threading.Event()

    def __call__(self, error: BaseException) -> None:
        self.errors.append(error)
        self.called.set()


def _sync_app(config: Config, on_load_failure: _Failures) -> Any:
    with mock.patch.object(server, "start_memory_sampler"), mock.patch.object(server, "settle"):
        return server.build_wsgi_app(Served(config), on_load_failure).test_client()


def test_the_sync_app_answers_while_its_model_loads(gate: Path) -> None:
    failures = _Failures()
    client = _sync_app(load_config(models=[model_path("LoadGate")], arch="sync"), failures)
    wait_for_file(gate.with_suffix(".loading"))
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/").status_code == 200
    ready = client.get("/v2/health/ready")
    assert ready.status_code == 503 and ready.json == {"ready": False, "loading": ["loadgate"]}
    model_ready = client.get("/v2/models/loadgate/ready")
    assert model_ready.status_code == 503 and model_ready.headers["Retry-After"] == "1"
    assert client.get("/v1/models/loadgate").status_code == 503
    late = client.post("/v1/models/loadgate:predict", json={"instances": [1]}, headers={"X-Request-Timeout-Ms": "50"})
    assert late.status_code == 504 and late.json["code"] == "deadline_exceeded"
    before = in_flight(client.get("/metrics").text)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, "/v1/models/loadgate:predict", json={"instances": [1, 2]})
        # Opened once the request is in, waiting for the load (not one that came after it).
        wait_until(lambda: in_flight(client.get("/metrics").text) == before + 1, what="the predict to wait")
        assert not waiting.done()
        gate.touch()
        answered = waiting.result(timeout=30)
    assert answered.status_code == 200 and answered.json == {"predictions": [1, 2]}
    wait_until(lambda: client.get("/v2/health/ready").status_code == 200, what="the app to be ready")
    assert client.get("/v2/models/loadgate/ready").json == {"name": "loadgate", "ready": True}
    assert not failures.errors


def test_a_sync_model_that_fails_to_load_goes_to_the_handler() -> None:
    failures = _Failures()
    client = _sync_app(load_config(models=[model_path("FailsToLoad")], arch="sync"), failures)
    assert failures.called.wait(30)
    assert "load failed on purpose" in str(failures.errors[0].__cause__ or failures.errors[0])
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 503  # never ready: the server stops
    refused = client.post("/v1/models/failstoload:predict", json={"instances": [1]})  # meanwhile: no wait
    assert refused.status_code == 503 and refused.json["code"] == "model_unavailable"


class _Lifespan:
    """The ASGI lifespan driven as uvicorn drives it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.sent: list[str] = []
        self.task: asyncio.Task[None] | None = None
        self.answered = asyncio.Event()

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message["type"])
        self.answered.set()

    async def startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.task = asyncio.get_running_loop().create_task(self.app(scope, self.inbox.get, self._send))
        await self.inbox.put({"type": "lifespan.startup"})
        async with asyncio.timeout(30):
            await self.answered.wait()

    async def shutdown(self) -> None:
        await self.inbox.put({"type": "lifespan.shutdown"})
        assert self.task is not None
        async with asyncio.timeout(30):
            await self.task


def _asgi(models: list[str], failures: _Failures) -> tuple[Service, Any]:
    config = load_config(models=models, arch="async", workers=1)
    service = Service(ModelRegistry.from_config(config), config)
    return service, create_asgi_app(service, on_load_failure=failures)


async def _until(condition: Any, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.01)


def test_the_async_app_answers_while_its_model_loads(gate: Path) -> None:
    failures = _Failures()
    service, app = _asgi([model_path("LoadGate")], failures)

    async def scenario() -> None:
        lifespan = _Lifespan(app)
        await lifespan.startup()
        assert lifespan.sent == ["lifespan.startup.complete"]  # at once: the model loads behind it
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30) as client:
            await asyncio.to_thread(wait_for_file, gate.with_suffix(".loading"))
            assert (await client.get("/v2/health/live")).status_code == 200
            ready = await client.get("/v2/health/ready")
            assert ready.status_code == 503 and ready.json() == {"ready": False, "loading": ["loadgate"]}
            model_ready = await client.get("/v2/models/loadgate/ready")
            assert model_ready.status_code == 503 and model_ready.headers["retry-after"] == "1"
            assert (await client.get("/v1/models/loadgate")).status_code == 503
            before = in_flight((await client.get("/metrics")).text)
            waiting = asyncio.create_task(client.post("/v1/models/loadgate:predict", json={"instances": [1, 2]}))

            async def in_and_waiting() -> bool:
                return in_flight((await client.get("/metrics")).text) == before + 1

            await _until(in_and_waiting)
            assert not waiting.done()
            gate.touch()
            answered = await waiting
            assert answered.status_code == 200 and answered.json() == {"predictions": [1, 2]}

            async def ready_now() -> bool:
                return (await client.get("/v2/health/ready")).status_code == 200

            await _until(ready_now)
        await lifespan.shutdown()
        assert lifespan.sent[-1] == "lifespan.shutdown.complete"

    asyncio.run(scenario())
    assert not failures.errors and not service.registry.starting


def test_an_async_model_that_fails_to_load_goes_to_the_handler() -> None:
    failures = _Failures()
    service, app = _asgi([model_path("FailsToLoad")], failures)

    async def scenario() -> None:
        lifespan = _Lifespan(app)
        await lifespan.startup()
        await asyncio.to_thread(failures.called.wait, 30)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30) as client:
            refused = await client.post("/v1/models/failstoload:predict", json={"instances": [1]})
            assert refused.status_code == 503 and refused.json()["code"] == "model_unavailable"
        await lifespan.shutdown()
        assert lifespan.sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]

    asyncio.run(scenario())
    assert "load failed on purpose" in str(failures.errors[0].__cause__ or failures.errors[0])
    assert service.registry.starting  # never ready


def test_the_async_app_stops_while_its_model_loads(gate: Path) -> None:
    """SIGTERM while a load runs: the lifespan's shutdown cancels the load and completes; the load's thread (a
    daemon) is left to the process's exit."""
    failures = _Failures()
    _, app = _asgi([model_path("LoadGate")], failures)

    async def scenario() -> None:
        lifespan = _Lifespan(app)
        await lifespan.startup()
        await asyncio.to_thread(wait_for_file, gate.with_suffix(".loading"))
        await lifespan.shutdown()  # within its timeout, with the gate still closed
        assert lifespan.sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]

    asyncio.run(scenario())
    assert not failures.errors
