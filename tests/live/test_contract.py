"""The HTTP contract, identical in every architecture: real servers on loopback, one parametrised suite."""

from __future__ import annotations

import concurrent.futures
import socket
from pathlib import Path
from typing import Any

import httpx

from tests.errors import error_fields, without_request_id
from tests.serving import HTTP, Server, predict, sample, scrape, wait_for_file, wait_until
from twinserve.examples.io import entity_features

SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = error_fields(response.json())
    assert error["code"] == code
    assert error["message"]
    assert error["request_id"] == response.headers["x-request-id"]
    return dict(error)


# -- metadata and health ---------------------------------------------------------------------------------------
def test_health(server: Server) -> None:
    assert HTTP.get(server.url + "/v2/health/live").json() == {"live": True}
    assert HTTP.get(server.url + "/v2/health/ready").json() == {"ready": True}


def test_list_models(server: Server) -> None:
    names = HTTP.get(server.url + "/v1/models").json()["models"]  # KServe V1's listing: names
    assert {"iris", "feature-lookup", "echo", "async-echo", "faulty", "gate", "where"} <= set(names)
    details = [HTTP.get(f"{server.url}/v1/models/{name}").json() for name in names]
    assert all(m["ready"] and m["version"] == "1" for m in details)


def test_model_metadata(server: Server) -> None:
    meta = HTTP.get(server.url + "/v1/models/iris").json()
    assert meta["name"] == "iris" and meta["ready"] is True
    assert set(meta["input_schema"]["required"]) == set(SETOSA)
    assert meta["output_schema"]["title"] == "IrisPrediction"
    assert meta["examples"][0] == SETOSA


def test_openapi_documents_each_model(server: Server) -> None:
    doc = HTTP.get(server.url + "/openapi.json").json()
    body = doc["paths"]["/v1/models/iris:predict"]["post"]["requestBody"]["content"]["application/json"]
    assert body["example"]["instances"][0] == SETOSA
    request_schema = doc["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
    assert request_schema["properties"]["instances"]["items"]["$ref"] == "#/components/schemas/IrisFeatures"
    assert "petal_width" in doc["components"]["schemas"]["IrisFeatures"]["properties"]
    assert "/v2/health/ready" in doc["paths"]
    page = HTTP.get(server.url + "/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'url: "/openapi.json"' in page.text


def test_openapi_is_the_same_in_every_architecture(servers: dict[str, Server]) -> None:
    docs = [HTTP.get(s.url + "/openapi.json").json() for s in servers.values()]
    assert all(d == docs[0] for d in docs)


# -- predictions -------------------------------------------------------------------------------------------
def test_tabular_prediction(server: Server) -> None:
    response = predict(server, "iris", [SETOSA, VIRGINICA])
    assert response.status_code == 200
    labels = [p["label"] for p in response.json()["predictions"]]
    assert labels == ["setosa", "virginica"]


def test_same_answers_in_every_architecture(servers: dict[str, Server]) -> None:
    cases: list[tuple[str, list[Any]]] = [
        ("iris", [SETOSA, VIRGINICA, {**SETOSA, "petal_length": 4.5, "petal_width": 1.5}]),
        ("echo", [1, "two", {"three": [3.0, None, True]}]),
        ("async-echo", [{"n": 1}, {"n": 2}]),
        ("mixed", [{"x": 3, "y": 4}, {"x": -2, "y": 5}]),
        ("feature-lookup", [{"entity_id": "user:1"}, {"entity_id": "user:42"}]),
        ("iris", [{"sepal_length": 5.1}]),
        ("nope", [1]),
        ("faulty", ["boom"]),
    ]
    for model, instances in cases:
        answers = {arch: predict(s, model, instances) for arch, s in servers.items()}
        statuses = {r.status_code for r in answers.values()}
        assert len(statuses) == 1, (model, {a: r.text for a, r in answers.items()})
        bodies = []
        for response in answers.values():
            body = response.json()
            if "error" in body:
                body = without_request_id(body)
            bodies.append(body)
        assert all(b == bodies[0] for b in bodies), (model, bodies)


def test_async_hooks_run_in_every_front(server: Server) -> None:
    response = predict(server, "async-echo", [{"n": 7}])
    assert response.json() == {"predictions": [{"n": 7, "preprocessed": True, "by": "async load"}]}
    assert predict(server, "mixed", [{"x": 3, "y": 4}]).json() == {"predictions": [13]}


def test_feature_lookup_reads_redis(server: Server) -> None:
    response = predict(server, "feature-lookup", [{"entity_id": "user:3"}, {"entity_id": "user:4"}])
    assert response.status_code == 200, response.text
    scores = response.json()["predictions"]
    assert [s["entity_id"] for s in scores] == ["user:3", "user:4"]
    assert all(0.0 <= s["score"] <= 1.0 for s in scores)
    assert entity_features(3) != entity_features(4)
    assert scores[0]["score"] != scores[1]["score"]


def test_concurrent_requests_get_their_own_answers(server: Server) -> None:
    def one(i: int) -> tuple[int, httpx.Response]:
        return i, predict(server, "echo", [{"client": i, "k": k} for k in range(i % 5 + 1)])

    with concurrent.futures.ThreadPoolExecutor(100) as pool:
        results = list(pool.map(one, range(100)))
    for i, response in results:
        assert response.status_code == 200
        assert response.json() == {"predictions": [{"client": i, "k": k} for k in range(i % 5 + 1)]}


# -- request ids -------------------------------------------------------------------------------------------
def test_request_id_is_echoed_or_generated(server: Server) -> None:
    echoed = predict(server, "echo", [1], headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    generated = {HTTP.get(server.url + "/v2/health/live").headers["x-request-id"] for _ in range(40)}
    assert len(generated) == 40  # unique across the server's worker processes too
    assert all(len(rid) == 32 for rid in generated)
    unsafe = predict(server, "echo", [1], headers={"X-Request-ID": "bad id\twith spaces"})
    assert unsafe.headers["x-request-id"] != "bad id\twith spaces"
    error = predict(server, "nope", [1], headers={"X-Request-ID": "err-9"})
    assert error_fields(error.json())["request_id"] == "err-9" == error.headers["x-request-id"]


# -- errors ------------------------------------------------------------------------------------------------
def test_every_worker_counts_the_requests_its_server_could_not_parse(server: Server) -> None:
    """The server's part of each worker process reaches the service that worker's app built (servers/served.py
    `Served`; here `--workers 2`): uvicorn's spawned workers have it only if the Config uvicorn pickled into each kept
    the app factory's and the protocol's one object shared. Sixteen connections reach both workers (uvicorn's
    SO_REUSEPORT sockets: all on one but for one chance in 30,000); each broken request is counted once, by its own."""

    def unparsed() -> float:
        return sample(scrape(server), "twinserve_unparsed_requests_total", reason="malformed_http")

    before = unparsed()
    for _ in range(16):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
            conn.sendall(b"GARBAGE\r\n\r\n")
            answer = b""
            while chunk := conn.recv(65536):  # the server closes after its answer
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    wait_until(lambda: unparsed() == before + 16, 30, "16 more malformed_http counted")


def test_malformed_json_is_400(server: Server) -> None:
    response = HTTP.post(
        f"{server.url}/v1/models/iris:predict",
        content=b'{"instances": [',
        headers={"content-type": "application/json"},
    )
    assert "not valid JSON" in assert_error(response, 400, "malformed_json")["message"]


def test_schema_violation_is_422_naming_index_and_field(server: Server) -> None:
    bad = {**VIRGINICA, "petal_width": "wide"}
    error = assert_error(predict(server, "iris", [SETOSA, bad]), 422, "validation_failed")
    assert error["message"].startswith("instances[1].petal_width:")
    assert error["details"][0]["loc"] == "instances[1].petal_width"
    missing = assert_error(
        predict(server, "iris", [{k: v for k, v in SETOSA.items() if k != "sepal_width"}]),
        422,
        "validation_failed",
    )
    assert missing["message"] == "instances[0].sepal_width: Field required"
    no_instances = HTTP.post(f"{server.url}/v1/models/iris:predict", json={"rows": []})
    assert assert_error(no_instances, 422, "validation_failed")["message"].startswith("instances:")
    not_object = HTTP.post(f"{server.url}/v1/models/iris:predict", json=[1, 2])
    assert_error(not_object, 422, "validation_failed")
    assert_error(predict(server, "iris", []), 422, "validation_failed")


def test_unknown_model_is_404(server: Server) -> None:
    assert "'nope'" in assert_error(predict(server, "nope", [1]), 404, "model_not_found")["message"]
    assert_error(HTTP.get(server.url + "/v1/models/nope"), 404, "model_not_found")
    assert_error(HTTP.get(server.url + "/v1/nothing/here"), 404, "not_found")


def test_wrong_method_is_405(server: Server) -> None:
    response = HTTP.get(server.url + "/v1/models/iris:predict")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    assert_error(HTTP.post(server.url + "/v1/models", json={}), 405, "method_not_allowed")
    assert_error(HTTP.delete(server.url + "/v2/health/live"), 405, "method_not_allowed")


def test_oversized_body_is_413(server: Server) -> None:
    big = ["x" * 1000] * 100  # ~100 kB, over the 64 KiB limit the suite's servers run with
    assert_error(predict(server, "echo", big), 413, "payload_too_large")

    def chunks() -> Any:  # no Content-Length: the limit must hold while streaming too
        yield b'{"instances": ['
        for _ in range(100):
            yield b'"' + b"x" * 1000 + b'",'
        yield b'"end"]}'

    chunked = HTTP.post(
        f"{server.url}/v1/models/echo:predict", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(chunked, 413, "payload_too_large")
    assert predict(server, "echo", ["small"]).status_code == 200


def test_wrong_content_type_is_415(server: Server) -> None:
    response = HTTP.post(
        f"{server.url}/v1/models/echo:predict",
        content=b'{"instances": [1]}',
        headers={"content-type": "text/plain"},
    )
    assert "text/plain" in assert_error(response, 415, "unsupported_media_type")["message"]
    charset = HTTP.post(
        f"{server.url}/v1/models/echo:predict",
        content=b'{"instances": [1]}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert charset.status_code == 200


def test_model_exception_is_500_and_server_keeps_serving(server: Server) -> None:
    error = assert_error(predict(server, "faulty", ["ok", "boom"]), 500, "model_error")
    # The model's own text is the log's (it may hold secrets); the client reads what failed and where.
    assert error["message"] == "model 'faulty' raised in predict; the server log has the details"
    assert predict(server, "faulty", ["ok"]).json() == {"predictions": ["OK"]}
    assert predict(server, "iris", [SETOSA]).status_code == 200
    server.wait_for_output("RuntimeError: exploded on purpose")  # the traceback reaches the server log
    assert "model 'faulty' raised in predict" in server.output()


def test_output_length_mismatch_is_500(server: Server) -> None:
    error = assert_error(predict(server, "mismatch", [1, 2, 3]), 500, "output_mismatch")
    assert error["message"] == "predict returned 2 outputs for 3 inputs"


def test_unknown_entity_is_422(server: Server) -> None:
    error = assert_error(predict(server, "feature-lookup", [{"entity_id": "ghost"}]), 422, "validation_failed")
    assert "'ghost'" in error["message"]


# -- the loop never blocks ---------------------------------------------------------------------------------
def test_blocking_predict_does_not_stall_health(server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "slow"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(predict, server, "gate", [{"gate": str(gate)}])
        wait_for_file(gate.with_suffix(".started"))
        # predict is now blocked inside the model; the server must still answer other requests.
        assert HTTP.get(server.url + "/v2/health/ready", timeout=10).status_code == 200
        assert predict(server, "echo", [1]).status_code == 200
        assert not pending.done()
        gate.with_suffix(".release").touch()
        assert pending.result(timeout=30).json() == {"predictions": ["released"]}


def test_blocking_model_code_runs_off_the_event_loop(server: Server) -> None:
    where = predict(server, "where", [1]).json()["predictions"][0]
    serving = HTTP.get(server.url + "/v1/models/where").json()["serving"]
    if serving["executor"] == "process":  # hybrid: in a model-worker process
        assert where["process"] == "twinserve-model-worker"
        assert len(serving["worker_pids"]) == 1
    else:  # async: on a predict thread, never the loop's; sync: in the request's own gthread thread
        assert where["main"] is False
