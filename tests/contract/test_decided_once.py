"""What an HTTP server decided from a request's head before the app (fronts/early.py, asked under a crowd) reaches
the front's exchange, which takes it as made: a request is admitted once (service/lifecycle.py `Decided`).

Each front is handed a `Decided` where its server puts one: the WSGI environ (servers/sync/worker.py) or the ASGI
scope's extensions (servers/asgi/protocol.py). It names the model loaded here while the path names one that does
not exist: the request goes on to that model's codec (422 for a body without instances: no model runs here, so the
one loaded for threads serves both fronts), so the route was not looked up again. Without it, the path's model is
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


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with echo_service(MODEL) as service:
        yield service


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


@pytest.mark.parametrize("front", [_sync, _async], ids=["wsgi", "asgi"])
def test_a_front_hands_the_servers_decision_to_its_exchange(front: Any, service: Service) -> None:
    decided = Decided(2, service.runtimes[MODEL])
    status, body = front(service, decided)
    assert status == 422 and "instances" in body["error"]
    status, body = front(service, None)
    assert status == 404 and "not-looked-up" in body["error"]
