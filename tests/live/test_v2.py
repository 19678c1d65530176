"""The Open Inference Protocol (V2) on real servers in every architecture, driven by NVIDIA's tritonclient and httpx."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.errors import error_fields
from tests.serving import HTTP, Server, predict
from twinserve import __version__
from twinserve.config import load_config
from twinserve.service.contract import Service

SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
VERSICOLOR = {"sepal_length": 6.4, "sepal_width": 3.2, "petal_length": 4.5, "petal_width": 1.5}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}
FLOWERS = [SETOSA, VERSICOLOR, VIRGINICA]


@pytest.fixture
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30) as http:
        yield http


def iris_input(rows: list[dict[str, float]], binary: bool = True) -> triton.InferInput:
    array = np.array([list(r.values()) for r in rows], dtype=np.float32)
    tensor = triton.InferInput("input", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def strings(name: str, values: list[str], binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=object), binary_data=binary)
    return tensor


def infer(server: Server, model: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return HTTP.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30, **kwargs)


def assert_v2_error(response: httpx.Response, status: int, fragment: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"]
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    assert fragment in body["error"], body
    return str(body["error"])


def assert_triton_error(call: Any, status: str, fragment: str) -> None:
    with pytest.raises(InferenceServerException) as raised:
        call()
    assert raised.value.status() == status, raised.value
    assert fragment in (raised.value.message() or ""), raised.value


def test_timeout_parameter_is_a_deadline_capped_like_the_header() -> None:
    service = Service({}, load_config(max_timeout_ms=1000))
    assert service.admission.tighten(None, None) is None
    start = time.monotonic()
    own = service.admission.tighten(None, 250_000)
    assert own is not None and start + 0.25 <= own <= time.monotonic() + 0.25
    capped = service.admission.tighten(None, 10**9)
    assert capped is not None and capped <= time.monotonic() + 1.0
    assert service.admission.tighten(start + 0.01, 250_000) == start + 0.01  # the header's, when earlier


# -- metadata and health ---------------------------------------------------------------------------------------
def test_health_and_metadata_through_tritonclient(server: Server, client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "twinserve" and metadata["version"] == __version__
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(metadata["extensions"])
    assert client.is_model_ready("iris") and client.is_model_ready("iris", "1")
    assert not client.is_model_ready("iris", "2") and not client.is_model_ready("nope")
    model = client.get_model_metadata("iris", "1")
    assert model == {
        "name": "iris",
        "versions": ["1"],
        "platform": "twinserve",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "class_id", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
    }
    config = client.get_model_config("iris")
    serving = HTTP.get(f"{server.url}/v1/models/iris").json()["serving"]
    assert config["name"] == "iris" and config["max_batch_size"] == serving["max_batch_size"]
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [4]}]
    assert [o["data_type"] for o in config["output"]] == ["TYPE_STRING", "TYPE_INT64", "TYPE_FP32"]
    assert_triton_error(lambda: client.get_model_metadata("nope"), "404", "'nope'")
    assert_triton_error(lambda: client.get_model_config("iris", "7"), "404", "no version '7'")


# -- inference -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_iris_fp32_inference(client: triton.InferenceServerClient, binary: bool) -> None:
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("label", "class_id", "probabilities")]
    result = client.infer("iris", [iris_input(FLOWERS, binary)], outputs=outputs, request_id="flowers-1")
    assert result.get_response()["id"] == "flowers-1"
    assert result.get_response()["model_name"] == "iris" and result.get_response()["model_version"] == "1"
    assert [label.decode() if binary else label for label in result.as_numpy("label").tolist()] == [
        "setosa",
        "versicolor",
        "virginica",
    ]
    assert result.as_numpy("class_id").tolist() == [0, 1, 2]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.dtype == np.float32 and probabilities.shape == (3, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_requested_outputs_only_and_default_binary(client: triton.InferenceServerClient) -> None:
    chosen = client.infer("iris", [iris_input([VIRGINICA])], outputs=[triton.InferRequestedOutput("class_id")])
    assert [o["name"] for o in chosen.get_response()["outputs"]] == ["class_id"]
    assert chosen.as_numpy("class_id").tolist() == [2]
    everything = client.infer("iris", [iris_input([SETOSA])])  # no outputs named: every output, as binary
    assert [o["name"] for o in everything.get_response()["outputs"]] == ["label", "class_id", "probabilities"]
    assert all("binary_data_size" in o["parameters"] for o in everything.get_response()["outputs"])


def test_bytes_inference(client: triton.InferenceServerClient) -> None:
    words = ["hello", "wörld", ""]
    for binary in (True, False):
        result = client.infer(
            "faulty",
            [strings("input", words, binary)],
            outputs=[triton.InferRequestedOutput("output", binary_data=binary)],
        )
        shouted = result.as_numpy("output").tolist()
        assert [w.decode() if binary else w for w in shouted] == ["HELLO", "WÖRLD", ""]


def test_declared_tensors_and_conversion_hooks(client: triton.InferenceServerClient) -> None:
    x = np.array([[1.0, 2.0], [3.0, -4.0]])
    scale = np.array([10.0, 0.5])
    inputs = [triton.InferInput("x", [2, 2], "FP64"), triton.InferInput("scale", [2], "FP64")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(scale, binary_data=False)
    result = client.infer("affine", inputs)
    np.testing.assert_array_equal(result.as_numpy("y"), x * scale[:, None])
    np.testing.assert_array_equal(result.as_numpy("total"), [30.0, -0.5])
    assert client.get_model_metadata("sensors")["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
    reading = strings("input", ['{"sensor": "s1", "values": [2, 4, 9]}'])
    summary = client.infer("sensors", [reading])
    assert summary.as_numpy("count").tolist() == [3] and summary.as_numpy("ok").tolist() == [True]
    assert summary.as_numpy("extremes").tolist() == [[2.0, 9.0]]


def test_errors_through_tritonclient(client: triton.InferenceServerClient) -> None:
    wide = triton.InferInput("input", [1, 5], "FP32")
    wide.set_data_from_numpy(np.ones((1, 5), dtype=np.float32))
    assert_triton_error(lambda: client.infer("iris", [wide]), "400", "has shape [1, 5]; the model takes [-1, 4]")
    doubles = triton.InferInput("input", [1, 4], "FP64")
    doubles.set_data_from_numpy(np.ones((1, 4)))
    assert_triton_error(lambda: client.infer("iris", [doubles]), "400", "datatype 'FP64'; the model takes FP32")
    stranger = triton.InferInput("features", [1, 4], "FP32")
    stranger.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert_triton_error(lambda: client.infer("iris", [stranger]), "400", "unknown input 'features'")
    unknown_output = [triton.InferRequestedOutput("species")]
    assert_triton_error(
        lambda: client.infer("iris", [iris_input([SETOSA])], outputs=unknown_output), "400", "unknown output 'species'"
    )
    assert_triton_error(lambda: client.infer("nope", [iris_input([SETOSA])]), "404", "model 'nope' is not served")
    negative = iris_input([{**SETOSA, "petal_width": -1.0}])
    assert_triton_error(lambda: client.infer("iris", [negative]), "422", "rows[0].petal_width: Input should be")
    assert_triton_error(
        lambda: client.infer("faulty", [strings("input", ["ok", "boom"])]), "500", "'faulty' raised in predict;"
    )


def test_errors_have_the_v2_body(server: Server) -> None:
    good = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [5.1, 3.5, 1.4, 0.2]}]}
    assert_v2_error(infer(server, "iris", {"inputs": []}), 400, "non-empty 'inputs' list")
    malformed = HTTP.post(f"{server.url}/v2/models/iris/infer", content=b"{", timeout=30)
    assert_v2_error(malformed, 400, "not valid JSON")
    assert_v2_error(infer(server, "nope", good), 404, "'nope'")
    versioned = HTTP.post(f"{server.url}/v2/models/iris/versions/9/infer", json=good, timeout=30)
    assert_v2_error(versioned, 404, "no version '9'")
    assert HTTP.post(f"{server.url}/v2/models/iris/versions/1/infer", json=good, timeout=30).status_code == 200
    text = infer(server, "iris", good, headers={"content-type": "text/plain"})
    assert_v2_error(text, 415, "application/json or application/octet-stream")
    wrong_method = HTTP.get(f"{server.url}/v2/models/iris/infer")
    assert_v2_error(wrong_method, 405, "GET is not allowed")
    assert_v2_error(HTTP.get(f"{server.url}/v2/no-such-extension"), 404, "no route")
    # twinserve's own routes keep their error body
    assert error_fields(HTTP.get(f"{server.url}/v1/models/nope").json())["code"] == "model_not_found"


def test_plain_json_request_and_request_ids(server: Server) -> None:
    body = {
        "id": "plain-1",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 4], "data": [[5.1, 3.5, 1.4, 0.2], [6.3] * 4]}],
        "outputs": [{"name": "label"}],
    }
    response = infer(server, "iris", body, headers={"X-Request-ID": "trace-7"})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "trace-7"
    assert response.json() == {
        "model_name": "iris",
        "model_version": "1",
        "id": "plain-1",
        "outputs": [{"name": "label", "datatype": "BYTES", "shape": [2], "data": ["setosa", "virginica"]}],
    }
    del body["id"]
    anonymous = infer(server, "iris", body, headers={"X-Request-ID": "trace-8"})
    assert anonymous.json()["id"] == "trace-8"  # no id given: the request's own


# -- one model, two protocols, three architectures ----------------------------------------------------------------
def test_v1_and_v2_give_the_same_predictions(server: Server) -> None:
    v1 = predict(server, "iris", FLOWERS).json()["predictions"]
    rows = [list(f.values()) for f in FLOWERS]
    v2 = infer(server, "iris", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [3, 4], "data": rows}]})
    outputs = {o["name"]: o for o in v2.json()["outputs"]}
    assert outputs["label"]["data"] == [p["label"] for p in v1]
    assert outputs["class_id"]["data"] == [p["class_id"] for p in v1]
    probabilities = np.array(outputs["probabilities"]["data"]).reshape(outputs["probabilities"]["shape"])
    np.testing.assert_allclose(probabilities, [p["probabilities"] for p in v1], atol=1e-6)
    assert (
        predict(server, "mixed", [{"x": 3, "y": 4}]).json()["predictions"]
        == infer(
            server, "mixed", {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 2], "data": [3, 4]}]}
        ).json()["outputs"][0]["data"]
    )
    echoed = infer(server, "echo", {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1], "data": ["[1]"]}]})
    assert echoed.json()["outputs"][0]["data"] == ["[1]"]


def test_same_answers_in_every_architecture(servers: dict[str, Server]) -> None:
    def tensor(name: str, datatype: str, shape: list[int], data: list[Any]) -> dict[str, Any]:
        return {"name": name, "datatype": datatype, "shape": shape, "data": data}

    cases: list[tuple[str, dict[str, Any]]] = [
        ("iris", {"inputs": [tensor("input", "FP32", [3, 4], [list(f.values()) for f in FLOWERS])]}),
        ("iris", {"inputs": [tensor("input", "FP32", [1, 3], [1, 2, 3])]}),
        ("iris", {"inputs": [tensor("input", "FP32", [1, 4], [1, 2, 3, -4])]}),
        ("faulty", {"inputs": [tensor("input", "BYTES", [2], ["a", "b"])]}),
        ("faulty", {"inputs": [tensor("input", "BYTES", [1], ["boom"])]}),
        ("async-echo", {"inputs": [tensor("input", "BYTES", [1], ['{"n": 1}'])]}),
        ("sensors", {"inputs": [tensor("input", "BYTES", [1], ['{"sensor": "z", "values": [0.5]}'])]}),
        ("affine", {"inputs": [tensor("x", "FP64", [1, 2], [1, 2]), tensor("scale", "FP64", [1], [3])]}),
        ("mismatch", {"inputs": [tensor("input", "INT64", [2], [1, 2])]}),
        ("nope", {"inputs": [tensor("input", "FP32", [1], [1])]}),
    ]
    for model, body in cases:
        answers = {arch: infer(s, model, {**body, "id": "same"}) for arch, s in servers.items()}
        assert len({r.status_code for r in answers.values()}) == 1, (model, {a: r.text for a, r in answers.items()})
        bodies = [r.json() for r in answers.values()]
        assert all(b == bodies[0] for b in bodies), (model, bodies)
    paths = ["/v2", "/v2/models/iris", "/v2/models/affine/versions/1", "/v2/models/sensors/ready"]
    for path in paths:
        assert len({HTTP.get(s.url + path).text for s in servers.values()}) == 1, path


# -- statistics ------------------------------------------------------------------------------------------------
def test_statistics_count_every_inference_request(server: Server, client: triton.InferenceServerClient) -> None:
    def stats() -> dict[str, Any]:
        entry: dict[str, Any] = client.get_inference_statistics("mixed")["model_stats"][0]
        return entry

    before = stats()
    for k in range(4):  # both protocols reach the same batcher and the same counters
        infer(server, "mixed", {"inputs": [{"name": "input", "datatype": "INT64", "shape": [2, 2], "data": [k] * 4}]})
    assert predict(server, "mixed", [{"x": 1, "y": 1}]).status_code == 200
    assert infer(server, "mixed", {"inputs": []}).status_code == 400
    after = stats()
    assert after["name"] == "mixed" and after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == 4 * 2 + 1
    assert 1 <= after["execution_count"] - before["execution_count"] <= 5
    delta = {k: {f: after["inference_stats"][k][f] - v[f] for f in v} for k, v in before["inference_stats"].items()}
    assert delta["success"]["count"] == 5 and delta["success"]["ns"] > 0
    assert delta["fail"]["count"] == 1 and delta["fail"]["ns"] > 0
    assert delta["queue"]["count"] == 5 and delta["compute_infer"]["count"] == 5
    assert delta["compute_input"]["count"] == delta["compute_output"]["count"] == 5
    assert delta["compute_infer"]["ns"] > 0
    every = HTTP.get(f"{server.url}/v2/models/stats").json()["model_stats"]
    assert {"iris", "mixed", "affine"} <= {entry["name"] for entry in every}


def test_openapi_documents_v2(server: Server) -> None:
    doc = HTTP.get(server.url + "/openapi.json").json()
    operation = doc["paths"]["/v2/models/iris/infer"]["post"]
    assert "`input` FP32 [-1, 4]" in operation["description"]
    example = operation["requestBody"]["content"]["application/json"]["example"]
    assert example["inputs"][0]["shape"] == [3, 4] and example["inputs"][0]["data"][:4] == list(SETOSA.values())
    assert infer(server, "iris", example).status_code == 200
    assert "/v2" in doc["paths"] and "V2InferenceRequest" in doc["components"]["schemas"]
