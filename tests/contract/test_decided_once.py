"""What an HTTP server decided from a request's head before the app (fronts/early.py, asked under a crowd) reaches
the front's exchange, which takes it as made: a request is admitted once (service/lifecycle.py `Decided`).

In every architecture, its front is handed a `Decided` where its server puts one: sync's WSGI environ
(servers/sync/worker.py), async's and hybrid's ASGI scope extensions (servers/asgi/protocol.py). It names the model
loaded here while the path names one that does not exist: the request goes on to that model's codec (422 for a
body without instances: no model runs here), so the route was not looked up again. Without it, the path's model is
looked up: 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.unit.service.echo import echo_service
from twinserve.fronts.asgi import create_asgi_app
from twinserve.fronts.wsgi import create_wsgi_app
from twinserve.service.contract import Service
from twinserve.service.lifecycle import DECIDED, Decided

MODEL = "decided-echo"
PATH = "/v1/models/not-looked-up:predict"
BODY = orjson.dumps({"inputs_are_not_instances": ["a"]})


@pytest.fixture(scope="module", params=["sync", "async", "hybrid"])
def arch(request: pytest.FixtureRequest) -> Iterator[tuple[str, Service]]:
    """Each architecture's service, over the front its server builds: Flask for sync, the ASGI app for async and
    hybrid (hybrid's model workers are not started: nothing here reaches a prediction)."""
    with echo_service(MODEL, arch=request.param) as service:
        yield request.param, service


def _sync(service: Service, decided: Decided | None) -> tuple[int, Any]:
    client = create_wsgi_app(service).test_client()
    extra = {} if decided is None else {DECIDED: decided}
    answer = client.post(PATH, data=BODY, content_type="application/json", environ_overrides=extra)
    return answer.status_code, orjson.loads(answer.data)


def _async(service: Service, decided: Decided | None) -> tuple[int, Any]:
    app = create_asgi_app(service)

    async def server(scope: Any, receive: Any, send: Any) -> None:
        if decided is not None:
            scope.setdefault("extensions", {})[DECIDED] = decided
        await app(scope, receive, send)

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=server)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post(PATH, content=BODY, headers={"content-type": "application/json"})

    answer = asyncio.run(post())
    return answer.status_code, answer.json()


def test_a_front_hands_the_servers_decision_to_its_exchange(arch: tuple[str, Service]) -> None:
    name, service = arch
    front = _sync if name == "sync" else _async
    decided = Decided(2, service.runtimes[MODEL])
    status, body = front(service, decided)
    assert status == 422 and "instances" in body["error"]
    status, body = front(service, None)
    assert status == 404 and "not-looked-up" in body["error"]
