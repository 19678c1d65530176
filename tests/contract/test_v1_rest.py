"""The V1 REST protocol as its own clients expect it, in every architecture, in process.

Rules, by source:
- TF-Serving REST API guide, "Predict API": `POST /v1/models/${MODEL}[/versions/${VERSION}]:predict`; "Request
  format": a body holds `instances` (row format) or `inputs` (columnar format), never both; a columnar request is
  answered with `outputs`, a row one with `predictions`; "Error": an error body is `{"error": "<message>"}`. Its
  curl examples send the body with `curl -d`, i.e. `Content-Type: application/x-www-form-urlencoded`.
- KServe V1 protocol: `GET /` is liveness (`{"status": "alive"}`), `GET /v1/models` lists the models' names
  (`{"models": [...]}`), `GET /v1/models/<name>` is a model's readiness (`name`, `ready`), errors carry `error` as
  the message string (the SDK shows it as the message).
- TF-Serving REST API guide, "JSON mapping": a DT_FLOAT or DT_DOUBLE value is a JSON number (its json_tensor.cc
  refuses any other JSON type for it); so a float field takes numbers, integers included, never `true` or a string
  such as `"1.5"`: a schema violation, 422 `validation_failed` like any other, rows and columns alike.
- twinserve keeps its `code` and `request_id` beside `error` (docs/http-contract.md "Error bodies"), and reads a
  form-typed (or untyped) body as JSON only from a client that is not a cross-site page (403 `cross_site`):
  browsers send `Origin` on every cross-site POST.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.inprocess import ARCHS_IN_PROCESS, Answer, AsyncClient, SyncClient, served_per_arch
from tests.serving import model_path

MODELS = ("twinserve.examples.tabular:Classifier", model_path("Echo"))
SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

Client = SyncClient | AsyncClient


@pytest.fixture(scope="module")
def apps() -> Iterator[dict[str, Client]]:
    with served_per_arch(MODELS, threads=4, cors_origins=["https://app.example"]) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


def _v1_error(answer: Answer, status: int, code: str) -> str:
    """The V1 error body: `error` the message string, twinserve's code and request id beside it, nothing else."""
    assert answer.status == status, answer.text
    body = answer.json()
    assert isinstance(body["error"], str) and body["error"], body
    assert body["code"] == code and body["request_id"] == answer.headers["x-request-id"], body
    assert set(body) <= {"error", "code", "request_id", "details"}, body
    return str(body["error"])


# -- KServe V1: liveness, listing, model readiness -----------------------------------------------------------
def test_root_is_kserve_liveness(app: Client) -> None:
    answer = app.request("GET", "/")
    assert (answer.status, answer.json()) == (200, {"status": "alive"})


def test_listing_is_names(app: Client) -> None:
    answer = app.request("GET", "/v1/models")
    assert answer.status == 200
    assert answer.json() == {"models": ["iris", "echo"]}


def test_model_details_at_its_own_path(app: Client) -> None:
    body = app.request("GET", "/v1/models/iris").json()
    assert body["name"] == "iris" and body["ready"] is True


# -- errors: `error` is the message ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/v1/models/nope", None, 404, "model_not_found"),
        ("POST", "/v1/models/nope:predict", {"instances": [1]}, 404, "model_not_found"),
        ("POST", "/v1/models/iris:predict", {"instances": [{"sepal_length": 1}]}, 422, "validation_failed"),
        ("GET", "/v1/models/iris:predict", None, 405, "method_not_allowed"),
        ("GET", "/v1/nowhere", None, 404, "not_found"),
    ],
)
def test_v1_errors_carry_the_message_as_error(
    app: Client, method: str, path: str, body: object, status: int, code: str
) -> None:
    _v1_error(app.request(method, path, json=body), status, code)


def test_v1_malformed_json_error(app: Client) -> None:
    answer = app.request(
        "POST", "/v1/models/echo:predict", content=b'{"instances": [', headers={"Content-Type": "application/json"}
    )
    assert "not valid JSON" in _v1_error(answer, 400, "malformed_json")


def test_non_v1_routes_keep_their_shapes(app: Client) -> None:
    """V2 routes: the Open Inference Protocol's `{"error": "message"}`; twinserve's other routes: nested."""
    v2 = app.request("GET", "/v2/models/nope")
    assert v2.status == 404 and list(v2.json()) == ["error"] and isinstance(v2.json()["error"], str)
    other = app.request("POST", "/metrics")
    assert other.status == 405 and other.json()["error"]["code"] == "method_not_allowed"


# -- TF-Serving: versions, columnar, one format per request -------------------------------------------------
def test_versioned_predict(app: Client) -> None:
    plain = app.request("POST", "/v1/models/iris:predict", json={"instances": [SETOSA]})
    versioned = app.request("POST", "/v1/models/iris/versions/1:predict", json={"instances": [SETOSA]})
    assert versioned.status == 200 and versioned.json() == plain.json()
    _v1_error(
        app.request("POST", "/v1/models/iris/versions/7:predict", json={"instances": [SETOSA]}), 404, "model_not_found"
    )


def test_columnar_named_inputs_answered_with_outputs(app: Client) -> None:
    columns = {name: [SETOSA[name], VIRGINICA[name]] for name in SETOSA}
    answer = app.request("POST", "/v1/models/iris:predict", json={"inputs": columns})
    assert answer.status == 200, answer.text
    rows = app.request("POST", "/v1/models/iris:predict", json={"instances": [SETOSA, VIRGINICA]}).json()
    outputs = answer.json()["outputs"]
    assert list(answer.json()) == ["outputs"]
    predictions = rows["predictions"]
    if isinstance(predictions[0], dict):  # named outputs go back as named lists
        assert outputs == {k: [p[k] for p in predictions] for k in predictions[0]}
    else:
        assert outputs == predictions


def test_columnar_list_inputs(app: Client) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", json={"inputs": [1, 2, 3]})
    assert (answer.status, answer.json()) == (200, {"outputs": [1, 2, 3]})


def test_columnar_named_outputs(app: Client) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", json={"inputs": {"a": [1, 2], "b": ["x", "y"]}})
    assert (answer.status, answer.json()) == (200, {"outputs": {"a": [1, 2], "b": ["x", "y"]}})


@pytest.mark.parametrize("inputs", [{"a": [1, 2], "b": [1]}, {}, [], 7, {"a": 1}])
def test_columnar_inputs_of_no_batch_shape_are_422(app: Client, inputs: object) -> None:
    _v1_error(app.request("POST", "/v1/models/echo:predict", json={"inputs": inputs}), 422, "validation_failed")


def test_columnar_inputs_validated_against_the_schema(app: Client) -> None:
    answer = app.request("POST", "/v1/models/iris:predict", json={"inputs": {"sepal_length": [1.0]}})
    _v1_error(answer, 422, "validation_failed")


@pytest.mark.parametrize("value", [True, "3.5"], ids=["true", "string"])
def test_a_float_field_takes_json_numbers_only(app: Client, value: object) -> None:
    row = {**SETOSA, "sepal_width": value}
    for body in ({"instances": [row]}, {"inputs": {name: [v] for name, v in row.items()}}):
        message = _v1_error(app.request("POST", "/v1/models/iris:predict", json=body), 422, "validation_failed")
        assert "sepal_width: Input should be a valid number" in message, message
    integers = {"instances": [{**SETOSA, "sepal_width": 3}]}
    assert app.request("POST", "/v1/models/iris:predict", json=integers).status == 200


def test_instances_and_inputs_together_are_400(app: Client) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", json={"instances": [1], "inputs": [1]})
    assert "never both" in _v1_error(answer, 400, "bad_request")


def test_inputs_inside_an_instance_is_not_columnar(app: Client) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", json={"instances": [{"inputs": [1]}]})
    assert (answer.status, answer.json()) == (200, {"predictions": [{"inputs": [1]}]})


# -- curl -d: a form content type ------------------------------------------------------------------------------
def test_form_typed_json_is_read_as_json(app: Client) -> None:
    body = json.dumps({"instances": [SETOSA]}).encode()
    answer = app.request("POST", "/v1/models/iris:predict", content=body, headers=FORM)
    assert answer.status == 200, answer.text
    assert answer.json() == app.request("POST", "/v1/models/iris:predict", json={"instances": [SETOSA]}).json()


def test_untyped_json_is_read_as_json(app: Client) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", content=b'{"instances": [1]}')
    assert (answer.status, answer.json()) == (200, {"predictions": [1]})
    _v1_error(app.request("POST", "/v1/models/echo:predict", content=b"{"), 400, "malformed_json")


def test_form_typed_non_json_is_415(app: Client) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", content=b"instances=1&x=2", headers=FORM)
    _v1_error(answer, 415, "unsupported_media_type")


@pytest.mark.parametrize("origin", ["https://app.example", "http://localhost:8000"])
def test_form_typed_json_from_an_allowed_origin(app: Client, origin: str) -> None:
    answer = app.request(
        "POST",
        "/v1/models/echo:predict",
        content=b'{"instances": [1]}',
        headers={**FORM, "Origin": origin},
    )
    assert answer.status == 200, answer.text


@pytest.mark.parametrize("headers", [FORM, {}])
def test_form_or_untyped_json_from_a_cross_site_page_is_403(app: Client, headers: dict[str, str]) -> None:
    # 415 before issue #44; now the refusal every state-changing route gives a page on another site
    # (tests/contract/test_control_api.py).
    answer = app.request(
        "POST",
        "/v1/models/echo:predict",
        content=b'{"instances": [1]}',
        headers={**headers, "Origin": "https://evil.example"},
    )
    _v1_error(answer, 403, "cross_site")


def test_other_media_types_still_415(app: Client) -> None:
    answer = app.request(
        "POST", "/v1/models/echo:predict", content=b'{"instances": [1]}', headers={"Content-Type": "text/plain"}
    )
    _v1_error(answer, 415, "unsupported_media_type")


def test_same_answers_everywhere(apps: dict[str, Client]) -> None:
    requests = [
        ("GET", "/", None, None),
        ("GET", "/v1/models", None, None),
        ("POST", "/v1/models/echo:predict", b'{"inputs": {"a": [1]}}', FORM),
        ("POST", "/v1/models/echo:predict", b'{"instances": [1], "inputs": [1]}', None),
        ("POST", "/v1/models/iris/versions/2:predict", b'{"instances": [1]}', None),
    ]
    for method, path, content, headers in requests:
        seen = []
        for app in apps.values():
            answer = app.request(method, path, content=content, headers=headers)
            body = answer.json()
            body.pop("request_id", None)
            seen.append((answer.status, body))
        assert all(s == seen[0] for s in seen), (path, seen)
