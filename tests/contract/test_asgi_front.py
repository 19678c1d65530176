"""The async front's own parts, in-process: the dispatcher compiled from the route table, and how the front learns
that a client has gone (the extension twinserve's HTTP protocol publishes, tests/unit/servers/, or a watcher task
without it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from twinserve.errors import ClientDisconnected, MethodNotAllowed, NotFound
from twinserve.fronts.disconnect import predict_unless_gone
from twinserve.fronts.dispatch import Dispatcher
from twinserve.service.routes import ROUTES, Route

TABLE = Dispatcher((route, route) for route in ROUTES)


def _example(path: str) -> str:
    return path.replace("{model}", "iris").replace("{version}", "1")


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_every_route_is_found_with_its_parameters(route: Route) -> None:
    found, params = TABLE.match(route.method, _example(route.path))
    assert found.name == route.name
    assert params == {
        name: value for name, value in (("model", "iris"), ("version", "1")) if f"{{{name}}}" in route.path
    }


def test_a_fixed_path_comes_before_the_template_it_also_matches() -> None:
    assert TABLE.match("GET", "/v2/models/stats")[0].path == "/v2/models/stats"
    found, params = TABLE.match("GET", "/v2/models/stats/stats")
    assert (found.path, params) == ("/v2/models/{model}/stats", {"model": "stats"})


@pytest.mark.parametrize("path", ["/v2/", "/docs/", "/v1/models/", "/v1/models//ws", "/v2/models/a:b/infer"])
def test_no_route_is_404_and_no_slash_is_added_or_removed(path: str) -> None:
    with pytest.raises(NotFound) as raised:
        TABLE.match("GET", path)
    assert raised.value.message == f"no route for GET {path}"


def test_another_method_is_405_naming_the_allowed_ones() -> None:
    with pytest.raises(MethodNotAllowed) as raised:
        TABLE.match("GET", "/v1/models/iris:predict")
    assert raised.value.message == "GET is not allowed on /v1/models/iris:predict"
    assert raised.value.headers == {"Allow": "POST"}
    with pytest.raises(MethodNotAllowed) as raised:
        TABLE.match("POST", "/v2/health/live")
    assert raised.value.headers == {"Allow": "GET, HEAD"}
    assert TABLE.match("HEAD", "/v2/health/live")[0].name == "live"


def test_the_hot_routes_are_tried_first_but_never_ahead_of_one_that_matches_the_same_paths() -> None:
    disjoint = Dispatcher(
        [(Route("meta", "GET", "/m/{model}"), "meta"), (Route("predict", "POST", "/m/{model}:p"), "p")]
    )
    assert [t.entry.target for t in disjoint._templates] == ["p", "meta"]
    shadowing = Dispatcher([(Route("meta", "GET", "/m/{model}"), "meta"), (Route("predict", "GET", "/m/{model}"), "p")])
    assert [t.entry.target for t in shadowing._templates] == ["meta", "p"]
    assert shadowing.match("GET", "/m/x") == ("meta", {"model": "x"})


# -- disconnect --------------------------------------------------------------------------------------------------


class _Runtime:
    def __init__(self) -> None:
        self.gone: list[Any] = []

    async def apredict(self, instances: list[Any], deadline: float | None = None, gone: Any = None) -> list[Any]:
        self.gone.append(gone)
        if gone is None:
            await asyncio.Event().wait()  # queued until the client leaves
        return ["computed"]


def _request(extensions: dict[str, Any] | None) -> Request:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}
    if extensions is not None:
        scope["extensions"] = extensions

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    return Request(scope, receive)


def test_a_watcher_task_sees_the_client_leave_and_the_queued_request_is_not_computed() -> None:
    runtime = _Runtime()
    with pytest.raises(ClientDisconnected):
        asyncio.run(predict_unless_gone(_request({}), runtime, [1], None))  # type: ignore[arg-type]
    assert runtime.gone == [None]
