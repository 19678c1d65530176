"""The HTTP contract of every route, in process: the same request gets the same answer in every architecture.

The apps are the ones the servers build (`tests/inprocess.py`), without sockets or subprocesses, so this whole
module runs in seconds. Each case is checked twice: against its expected answer in each architecture
(`test_route`), and across the architectures at once (`test_same_answer_everywhere`: same status, same content
type, same body once the request id is taken out). What needs a real HTTP server (parser limits, connections,
signals, several server processes) stays in the real-socket suites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.errors import error_fields, without_request_id
from tests.inprocess import ARCHS_IN_PROCESS, Answer, AsyncClient, SyncClient, served, served_per_arch
from tests.serving import model_path
from twinserve.service.routes import ROUTES

#: What a client reads of a model's own failure: its exception text is the log's (tests/live/test_model_errors.py).
IN_THE_LOG = "the server log has the details"

SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}
MAX_BODY = 65536
KEY = "in-process-key-0123456789"

#: The contract suite's models (tests/conftest.py CONTRACT_MODELS) that need no Redis and never block, and a
#: streaming one.
MODELS = (
    "twinserve.examples.tabular:Classifier",
    "twinserve.examples.tokens:Tokens",
    *(model_path(name) for name in ("Echo", "AsyncEcho", "Mixed", "Faulty", "Mismatch", "Affine", "Sensors")),
)

Client = SyncClient | AsyncClient


@pytest.fixture(scope="module")
def apps() -> Iterator[dict[str, Client]]:
    """One app per architecture, same models and settings (as the contract suite's servers)."""
    with served_per_arch(MODELS, max_body_bytes=MAX_BODY, threads=8) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


# -- the cases ------------------------------------------------------------------------------------------------
def error(answer: Answer, code: str) -> dict[str, Any]:
    """twinserve's error body (V1 routes': flat, `error` the message): its code, a message, and the request id
    the response header carries."""
    assert answer.content_type == "application/json", answer.text
    body = error_fields(answer.json())
    assert body["code"] == code, answer.text
    assert body["message"]
    assert body["request_id"] == answer.headers["x-request-id"]
    return dict(body)


def v2_error(answer: Answer, words: str) -> None:
    """The Open Inference Protocol's error body: `{"error": "message"}` and nothing else."""
    assert answer.content_type == "application/json", answer.text
    body = answer.json()
    assert list(body) == ["error"] and words in body["error"], answer.text


def comparable(answer: Answer) -> Any:
    """The part of an answer every architecture must give identically: JSON without the request id."""
    if not answer.content_type.startswith("application/json"):
        return answer.body
    return without_request_id(answer.json())


def without_serving(answer: Answer) -> Any:
    """Model metadata less its `serving` block (executor, batch size, worker pids: the architecture's own)."""
    body = answer.json()
    body.pop("serving", None)
    return body


def without_batching(answer: Answer) -> Any:
    """A model configuration less its batching (size 1 for sync, 32 with a dynamic-batching block for async and
    hybrid, unless set)."""
    body = answer.json()
    body.pop("max_batch_size", None)
    body.pop("dynamic_batching", None)
    return body


def stats_shape(answer: Answer) -> Any:
    """Statistics hold timings and counts; their shape must agree: which models, which fields."""
    stats = answer.json()["model_stats"]
    return [(s["name"], s["version"], sorted(s), sorted(s["inference_stats"])) for s in stats]


@dataclass(frozen=True)
class Case:
    id: str
    route: str  # the `Route.name` it exercises
    method: str
    path: str
    status: int
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    check: Callable[[Answer], object] | None = None
    same: Callable[[Answer], Any] = comparable  # what must be equal across the architectures

    def send(self, app: Client) -> Answer:
        return app.request(self.method, self.path, json=self.json, content=self.content, headers=self.headers)


def _labels(answer: Answer) -> None:
    assert [p["label"] for p in answer.json()["predictions"]] == ["setosa", "virginica"]


def _models(answer: Answer) -> None:
    models = answer.json()["models"]  # KServe V1's listing: the names (issue #17)
    assert {"iris", "tokens", "echo", "async-echo", "mixed", "faulty", "mismatch", "affine", "sensors"} <= set(models)
    assert all(isinstance(m, str) for m in models)


def _iris(answer: Answer) -> None:
    meta = answer.json()
    assert meta["name"] == "iris" and meta["ready"] is True
    assert set(meta["input_schema"]["required"]) == set(SETOSA)
    assert meta["output_schema"]["title"] == "IrisPrediction"
    assert meta["examples"][0] == SETOSA


def _invalid_field(answer: Answer) -> None:
    body = error(answer, "validation_failed")
    assert body["message"].startswith("instances[1].petal_width:")
    assert body["details"][0]["loc"] == "instances[1].petal_width"


def _missing_field(answer: Answer) -> None:
    assert error(answer, "validation_failed")["message"] == "instances[0].sepal_width: Field required"


def _method_not_allowed(answer: Answer) -> None:
    error(answer, "method_not_allowed")
    assert answer.headers["allow"] == "POST"


def _v2_server(answer: Answer) -> None:
    meta = answer.json()
    assert meta["name"] == "twinserve" and meta["version"]
    assert isinstance(meta["extensions"], list)


def _v2_iris(answer: Answer) -> None:
    meta = answer.json()
    assert meta["name"] == "iris" and meta["versions"] == ["1"] and meta["platform"]
    assert {t["name"] for t in meta["inputs"]} and {t["name"] for t in meta["outputs"]}


def _repository_index(answer: Answer) -> None:
    # MODEL arguments are a repository of one version each, every one READY.
    index = {entry["name"]: entry for entry in answer.json()}
    assert index["iris"] == {"name": "iris", "version": "1", "state": "READY", "reason": ""}


def _v2_config(answer: Answer) -> None:
    assert answer.json()["name"] == "iris"


def _v2_stats(answer: Answer) -> None:
    stats = answer.json()["model_stats"]
    assert [s["name"] for s in stats] == ["iris"]
    assert {"success", "fail", "queue", "compute_infer"} <= set(stats[0]["inference_stats"])


def _v2_all_stats(answer: Answer) -> None:
    assert {s["name"] for s in answer.json()["model_stats"]} >= {"iris", "echo", "tokens"}


def _v2_infer(answer: Answer) -> None:
    body = answer.json()
    assert body["model_name"] == "iris" and body["model_version"] == "1" and body["id"] == "fixed-1"
    assert body["outputs"] == [{"name": "label", "datatype": "BYTES", "shape": [2], "data": ["setosa", "virginica"]}]


def _openapi(answer: Answer) -> None:
    doc = answer.json()
    assert doc["openapi"].startswith("3.")
    assert "/v1/models/iris:predict" in doc["paths"] and "/v2/health/ready" in doc["paths"]


def _docs(answer: Answer) -> None:
    assert answer.content_type.startswith("text/html")
    assert 'url: "/openapi.json"' in answer.text
    assert "https://" not in answer.text  # its assets are the server's own: /docs works without internet


def _asset(media_type: str) -> Callable[[Answer], None]:
    def check(answer: Answer) -> None:
        assert answer.content_type.startswith(media_type) and len(answer.body) > 10_000
        assert answer.headers["cache-control"] == "public, max-age=86400"

    return check


def _metrics(answer: Answer) -> None:
    assert answer.content_type.startswith("text/plain")
    assert "twinserve_requests_total" in answer.text


def _stream(answer: Answer) -> None:
    assert answer.content_type.startswith("text/event-stream")
    assert answer.text.count('data: {"predictions":') == 3
    assert answer.text.endswith("event: end\ndata: {}\n\n")


def _request_id(answer: Answer) -> None:
    assert answer.headers["x-request-id"] == "trace-abc-123"
    assert answer.json() == {"predictions": [1]}


def _error_request_id(answer: Answer) -> None:
    assert error(answer, "model_not_found")["request_id"] == "trace-err-9"


def _code(code: str) -> Callable[[Answer], object]:
    return lambda answer: error(answer, code)


def _v2(words: str) -> Callable[[Answer], object]:
    return lambda answer: v2_error(answer, words)


def _repository_error(words: str) -> Callable[[Answer], object]:
    """The model repository's error (an extension, not the Open Inference Protocol): V1's flat body, whose `error`
    is the message Triton's and KServe's clients read, with the code and request id every other error has."""

    def check(answer: Answer) -> None:
        body = answer.json()
        assert words in body["error"] and set(body) == {"error", "code", "request_id"}, body
        error(answer, "model_control_off")

    return check


def _constant(answer: Answer) -> Any:
    return None  # arch-specific bodies (metrics): status and content type must still agree


IRIS_V2 = {
    "id": "fixed-1",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 4], "data": [[5.1, 3.5, 1.4, 0.2], [6.3] * 4]}],
    "outputs": [{"name": "label"}],
}
JSON = {"content-type": "application/json"}
BIG = {"instances": ["x" * 1000] * 100}  # ~100 kB, over MAX_BODY

CASES = [
    Case("kserve-liveness", "alive", "GET", "/", 200, check=lambda a: a.json() == {"status": "alive"}),
    Case("list-models", "list_models", "GET", "/v1/models", 200, check=_models),
    Case("predict-version", "predict", "POST", "/v1/models/iris/versions/1:predict", 200,
         json={"instances": [SETOSA, VIRGINICA]}, check=_labels),
    Case("predict-unknown-version", "predict", "POST", "/v1/models/iris/versions/2:predict", 404,
         json={"instances": [SETOSA]}, check=_code("model_not_found")),
    Case("model-metadata", "model_metadata", "GET", "/v1/models/iris", 200, check=_iris, same=without_serving),
    Case("metadata-unknown-model", "model_metadata", "GET", "/v1/models/nope", 404, check=_code("model_not_found")),
    Case("predict", "predict", "POST", "/v1/models/iris:predict", 200, json={"instances": [SETOSA, VIRGINICA]},
         check=_labels),
    Case("predict-async-hooks", "predict", "POST", "/v1/models/async-echo:predict", 200,
         json={"instances": [{"n": 7}]},
         check=lambda a: a.json() == {"predictions": [{"n": 7, "preprocessed": True, "by": "async load"}]}),
    Case("predict-invalid-field", "predict", "POST", "/v1/models/iris:predict", 422,
         json={"instances": [SETOSA, {**VIRGINICA, "petal_width": "wide"}]}, check=_invalid_field),
    Case("predict-missing-field", "predict", "POST", "/v1/models/iris:predict", 422,
         json={"instances": [{k: v for k, v in SETOSA.items() if k != "sepal_width"}]}, check=_missing_field),
    Case("predict-no-instances", "predict", "POST", "/v1/models/iris:predict", 422, json={"rows": []},
         check=lambda a: error(a, "validation_failed")["message"].startswith("instances:")),
    Case("predict-malformed-json", "predict", "POST", "/v1/models/iris:predict", 400, content=b'{"instances": [',
         headers=JSON, check=lambda a: "not valid JSON" in error(a, "malformed_json")["message"]),
    Case("predict-text-plain", "predict", "POST", "/v1/models/echo:predict", 415, content=b'{"instances": [1]}',
         headers={"content-type": "text/plain"},
         check=lambda a: "text/plain" in error(a, "unsupported_media_type")["message"]),
    Case("predict-charset", "predict", "POST", "/v1/models/echo:predict", 200, content=b'{"instances": [1]}',
         headers={"content-type": "application/json; charset=utf-8"}),
    Case("predict-too-large", "predict", "POST", "/v1/models/echo:predict", 413, json=BIG,
         check=lambda a: "--max-body-bytes" in error(a, "payload_too_large")["message"]),
    Case("predict-unknown-model", "predict", "POST", "/v1/models/nope:predict", 404, json={"instances": [1]},
         check=lambda a: "'nope'" in error(a, "model_not_found")["message"]),
    Case("predict-model-error", "predict", "POST", "/v1/models/faulty:predict", 500, json={"instances": ["boom"]},
         check=lambda a: error(a, "model_error")["message"] == f"model 'faulty' raised in predict; {IN_THE_LOG}"),
    Case("predict-output-mismatch", "predict", "POST", "/v1/models/mismatch:predict", 500,
         json={"instances": [1, 2, 3]},
         check=lambda a: error(a, "output_mismatch")["message"] == "predict returned 2 outputs for 3 inputs"),
    Case("predict-wrong-method", "predict", "GET", "/v1/models/iris:predict", 405, check=_method_not_allowed),
    Case("list-wrong-method", "list_models", "POST", "/v1/models", 405, json={},
         check=_code("method_not_allowed")),
    Case("live-wrong-method", "live", "DELETE", "/v2/health/live", 405, check=_code("method_not_allowed")),
    Case("unknown-route", "", "GET", "/v1/nothing/here", 404, check=_code("not_found")),
    Case("request-id-echoed", "predict", "POST", "/v1/models/echo:predict", 200, json={"instances": [1]},
         headers={"X-Request-ID": "trace-abc-123"}, check=_request_id),
    Case("request-id-in-error", "predict", "POST", "/v1/models/nope:predict", 404, json={"instances": [1]},
         headers={"X-Request-ID": "trace-err-9"}, check=_error_request_id),
    Case("stream", "stream", "POST", "/v1/models/tokens:stream", 200,
         json={"instances": [{"text": "Why stream?", "max_tokens": 3}]}, check=_stream),
    Case("stream-not-streaming", "stream", "POST", "/v1/models/echo:stream", 400, json={"instances": [1]},
         check=_code("not_streaming")),
    Case("stream-unknown-model", "stream", "POST", "/v1/models/nope:stream", 404, json={"instances": [1]},
         check=_code("model_not_found")),
    Case("live", "live", "GET", "/v2/health/live", 200, check=lambda a: a.json() == {"live": True}),
    Case("ready", "ready", "GET", "/v2/health/ready", 200, check=lambda a: a.json() == {"ready": True}),
    Case("v2-server-metadata", "server_metadata", "GET", "/v2", 200, check=_v2_server),
    Case("v2-model-metadata", "v2_model_metadata", "GET", "/v2/models/iris", 200, check=_v2_iris),
    Case("v2-model-metadata-version", "v2_model_metadata", "GET", "/v2/models/iris/versions/1", 200,
         check=_v2_iris),
    Case("v2-model-metadata-unknown", "v2_model_metadata", "GET", "/v2/models/nope", 404, check=_v2("'nope'")),
    Case("v2-model-ready", "model_ready", "GET", "/v2/models/iris/ready", 200),
    Case("v2-model-ready-version", "model_ready", "GET", "/v2/models/iris/versions/1/ready", 200),
    Case("v2-model-config", "model_config", "GET", "/v2/models/iris/config", 200, check=_v2_config,
         same=without_batching),
    Case("v2-model-config-version", "model_config", "GET", "/v2/models/iris/versions/1/config", 200,
         check=_v2_config, same=without_batching),
    Case("v2-model-stats", "model_stats", "GET", "/v2/models/iris/stats", 200, check=_v2_stats, same=stats_shape),
    Case("v2-model-stats-version", "model_stats", "GET", "/v2/models/iris/versions/1/stats", 200,
         check=_v2_stats, same=stats_shape),
    Case("v2-all-stats", "model_stats", "GET", "/v2/models/stats", 200, check=_v2_all_stats, same=stats_shape),
    Case("repository-index", "repository_index", "POST", "/v2/repository/index", 200, json={},
         check=_repository_index),
    # MODEL arguments (and --model-control none) load at start only.
    Case("repository-load-off", "repository_load", "POST", "/v2/repository/models/iris/load", 400, json={},
         check=_repository_error("--model-control none")),
    Case("repository-unload-off", "repository_unload", "POST", "/v2/repository/models/iris/unload", 400, json={},
         check=_repository_error("--model-control none")),
    Case("repository-traffic", "repository_traffic", "GET", "/v2/repository/models/iris/traffic", 200,
         check=lambda a: a.json()["traffic"] == {"split": {}, "sticky_header": None, "shadow": None}),
    Case("repository-set-traffic-off", "repository_set_traffic", "POST", "/v2/repository/models/iris/traffic", 400,
         json={"split": {"1": 1}}, check=_repository_error("--model-control none")),
    Case("v2-infer", "infer", "POST", "/v2/models/iris/infer", 200, json=IRIS_V2, check=_v2_infer),
    Case("v2-infer-version", "infer", "POST", "/v2/models/iris/versions/1/infer", 200, json=IRIS_V2,
         check=_v2_infer),
    Case("v2-infer-no-inputs", "infer", "POST", "/v2/models/iris/infer", 400, json={"inputs": []},
         check=_v2("non-empty 'inputs' list")),
    Case("v2-infer-malformed", "infer", "POST", "/v2/models/iris/infer", 400, content=b"{", headers=JSON,
         check=_v2("not valid JSON")),
    Case("v2-infer-unknown-model", "infer", "POST", "/v2/models/nope/infer", 404, json=IRIS_V2,
         check=_v2("'nope'")),
    Case("v2-infer-unknown-version", "infer", "POST", "/v2/models/iris/versions/9/infer", 404, json=IRIS_V2,
         check=_v2("no version '9'")),
    Case("v2-infer-text-plain", "infer", "POST", "/v2/models/iris/infer", 415, content=b"{}",
         headers={"content-type": "text/plain"}, check=_v2("application/json or application/octet-stream")),
    Case("v2-infer-wrong-method", "infer", "GET", "/v2/models/iris/infer", 405, check=_v2("GET is not allowed")),
    Case("v2-unknown-route", "", "GET", "/v2/no-such-extension", 404, check=_v2("no route")),
    Case("openapi", "openapi", "GET", "/openapi.json", 200, check=_openapi),
    Case("docs", "docs", "GET", "/docs", 200, check=_docs),
    Case("docs-css", "docs_css", "GET", "/docs/swagger-ui.css", 200, check=_asset("text/css")),
    Case("docs-js", "docs_js", "GET", "/docs/swagger-ui-bundle.js", 200, check=_asset("text/javascript")),
    Case("metrics", "metrics", "GET", "/metrics", 200, check=_metrics, same=_constant),
]  # fmt: skip

#: Same request, answers that differ by design: (architecture, status, error code).
WEBSOCKET = {"sync": (501, "websocket_unsupported"), "async": (426, "upgrade_required")}
WEBSOCKET["hybrid"] = WEBSOCKET["async"]


def test_every_route_has_a_case() -> None:
    covered = {case.route for case in CASES} | {"websocket"}
    assert {route.name for route in ROUTES} <= covered
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_route(app: Client, case: Case) -> None:
    answer = case.send(app)
    assert answer.status == case.status, answer.text
    assert answer.headers["x-request-id"]
    if case.check is not None:
        assert case.check(answer) is not False, answer.text


PARITY = [
    *CASES,
    Case("v2-trailing-slash", "server_metadata", "GET", "/v2/", 404),
]


@pytest.mark.parametrize("case", PARITY, ids=lambda case: case.id)
def test_same_answer_everywhere(apps: dict[str, Client], case: Case) -> None:
    answers = {arch: case.send(app) for arch, app in apps.items()}
    statuses = {arch: a.status for arch, a in answers.items()}
    assert len(set(statuses.values())) == 1, statuses
    types = {arch: a.content_type for arch, a in answers.items()}
    assert len(set(types.values())) == 1, types
    bodies = {arch: case.same(a) for arch, a in answers.items()}
    first = next(iter(bodies.values()))
    assert all(body == first for body in bodies.values()), bodies


def test_websocket_route_over_plain_http(app: Client) -> None:
    status, code = WEBSOCKET[app.arch]
    answer = app.request("GET", "/v1/models/echo/ws")
    assert answer.status == status, answer.text
    error(answer, code)
    if status == 426:
        assert answer.headers["upgrade"] == "websocket"


def test_generated_request_ids_are_unique(app: Client) -> None:
    ids = {app.request("GET", "/v2/health/live").headers["x-request-id"] for _ in range(20)}
    assert len(ids) == 20 and all(len(rid) == 32 for rid in ids)
    unsafe = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]},
                         headers={"X-Request-ID": "bad id\twith spaces"})  # fmt: skip
    assert unsafe.headers["x-request-id"] != "bad id\twith spaces"


# -- settings that change the contract: each gets apps of its own -------------------------------------------
#: hybrid spawns its model-worker processes for every app (seconds each): it is in the suite above, and these
#: settings stay covered for hybrid by the real-socket suites (tests/live/test_auth.py, tests/live/test_limits.py).
SETTINGS_ARCHS = ("sync", "async")


@pytest.mark.parametrize("arch", SETTINGS_ARCHS)
def test_api_key(arch: str) -> None:
    with served(arch, [model_path("Echo")], api_keys=[KEY]) as app:
        missing = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]})
        assert missing.status == 401, missing.text
        assert missing.headers["www-authenticate"] == 'Bearer realm="twinserve"'
        error(missing, "unauthorized")
        wrong = app.request("GET", "/v1/models", headers={"Authorization": "Bearer not-the-key"})
        assert wrong.status == 401
        assert wrong.headers["www-authenticate"] == 'Bearer realm="twinserve", error="invalid_token"'
        v2 = app.request("POST", "/v2/models/echo/infer", json={})
        assert v2.status == 401
        v2_error(v2, "API key")
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"X-API-Key": KEY}):
            ok = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]}, headers=headers)
            assert ok.status == 200 and ok.json() == {"predictions": [1]}, ok.text
        for probe in ("/v2/health/live", "/v2/health/ready", "/metrics"):  # probes and scrapes stay open
            assert app.request("GET", probe).status == 200, probe


@pytest.mark.parametrize("arch", SETTINGS_ARCHS)
def test_rate_limit(arch: str) -> None:
    with served(arch, [model_path("Echo")], rate_limit=0.01, rate_burst=1) as app:
        first = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]})
        assert first.status == 200, first.text
        second = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]})
        assert second.status == 429, second.text
        error(second, "rate_limited")
        assert int(second.headers["retry-after"]) >= 1


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_priority_header_and_parameter(arch: str) -> None:
    """`X-Priority` (and V2's `parameters.priority`, Triton's) name a level from 1, the highest, to
    `--priority-levels`; any other value is a 400 with the same body in every architecture."""
    with served(arch, [model_path("Echo")]) as app:
        for level in ("1", "2", "3"):
            ok = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]}, headers={"X-Priority": level})
            assert ok.status == 200 and ok.json() == {"predictions": [1]}, ok.text
        for bad in ("0", "4", "urgent"):
            refused = app.request(
                "POST", "/v1/models/echo:predict", json={"instances": [1]}, headers={"X-Priority": bad}
            )
            assert refused.status == 400, refused.text
            assert (
                "X-Priority must be a whole number from 1 (the highest) to 3"
                in error(refused, "bad_request")["message"]
            )
        tensor = {"name": "input", "shape": [1], "datatype": "BYTES", "data": ["1"]}  # JSON text, per instance
        levels: tuple[tuple[int | str, int], ...] = ((2, 200), (7, 400), ("high", 400))
        for priority, status in levels:
            body = {"inputs": [tensor], "parameters": {"priority": priority}}
            answer = app.request("POST", "/v2/models/echo/infer", json=body)
            assert answer.status == status, answer.text
        v2_error(answer, "parameters.priority must be a whole number")


@pytest.mark.parametrize("arch", SETTINGS_ARCHS)
def test_default_deadline(arch: str) -> None:
    """504 at the deadline in every architecture, also while predict runs (sync used to answer 200 after it)."""
    with served(arch, [model_path("Slow")], timeout_ms=100) as app:
        late = app.request("POST", "/v1/models/slow:predict", json={"instances": [1]})
        assert late.status == 504, late.text
        error(late, "deadline_exceeded")


def _served_at(app: Client, level: str) -> float:
    """How many of echo's requests the server counted as answered 200 at priority `level`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = app.request("GET", "/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "twinserve_priority_requests_total" and s.labels == {
                "model": "echo",
                "priority": level,
                "outcome": "ok",
            }:
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_an_api_key_file_sets_a_keys_priority_level(arch: str, tmp_path: Path) -> None:
    """`KEY priority=3` in --api-key-file: that key's requests are level 3, even when they ask for 1."""
    batch_key = "batch-jobs-0123456789"
    keys = tmp_path / "keys"
    keys.write_text(f"{batch_key} priority=3\n{KEY}\n")
    with served(arch, [model_path("Echo")], api_key_file=str(keys)) as app:
        before = _served_at(app, "3")
        for asked in ({}, {"X-Priority": "1"}):
            headers = {"X-API-Key": batch_key, **asked}
            answer = app.request("POST", "/v1/models/echo:predict", json={"instances": [1]}, headers=headers)
            assert answer.status == 200, answer.text
        assert _served_at(app, "3") == before + 2
