"""Errors say what failed, not why inside the model: a model's exception text (a credential, a host, another
client's input) reaches the server log with the request id, never a client, unless `--expose-errors` and then
only the client whose request was computed alone. Real servers, every architecture, every way an answer leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.models import SECRET
from tests.serving import HTTP, Server, model_path

LEAKY, LEAKY_STREAM = model_path("Leaky"), model_path("LeakyStream")
#: One server process holding the batch, and room for both requests of a shared batch to meet in it.
ONE_PROCESS = {
    "sync": ["--workers", "1", "--threads", "8"],
    "async": ["--workers", "1"],
    "hybrid": ["--model-workers", "1"],
}


@pytest.fixture(scope="module", params=ARCHS)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with Server([LEAKY, LEAKY_STREAM], request.param, "--log-format", "json") as running:
        yield running


@pytest.fixture(scope="module", params=ARCHS)
def exposing(request: pytest.FixtureRequest) -> Iterator[Server]:
    """`--expose-errors`, and batches of two instances held up to 5 s so that two requests share one."""
    arch = request.param
    flags = ["--expose-errors", "--max-batch-size", "2", "--max-batch-delay-ms", "5000", *ONE_PROCESS[arch]]
    with Server([LEAKY], arch, "--log-format", "json", *flags) as running:
        yield running


def predict(server: Server, instances: list[str], model: str = "leaky") -> httpx.Response:
    return HTTP.post(f"{server.url}/v1/models/{model}:predict", json={"instances": instances}, timeout=30)


def logged_with_its_id(server: Server, request_id: str) -> None:
    """The secret is in the log, in an event that names the request it failed."""
    server.wait_for_output(SECRET)
    events = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    assert any(SECRET in json.dumps(e) and request_id in json.dumps(e) for e in events), request_id


@pytest.mark.parametrize(("instance", "stage"), [("secret", "predict"), ("pre-secret", "preprocess")])
def test_v1_answers_the_code_the_model_and_the_id_not_the_text(server: Server, instance: str, stage: str) -> None:
    response = predict(server, [instance])
    assert response.status_code == 500
    error = error_fields(response.json())
    assert error == {
        "code": "model_error",
        "message": f"model 'leaky' raised in {stage}; the server log has the details",
        "request_id": response.headers["x-request-id"],
    }
    assert "sk-live" not in response.text and "db.internal" not in response.text
    logged_with_its_id(server, response.headers["x-request-id"])
    assert predict(server, ["ok"]).json() == {"predictions": ["OK"]}  # and it keeps serving


def test_v2_answers_without_the_text(server: Server) -> None:
    body = {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1], "data": ["secret"]}]}
    response = HTTP.post(f"{server.url}/v2/models/leaky/infer", json=body, timeout=30)
    assert response.status_code == 500
    assert response.json() == {"error": "model 'leaky' raised in predict; the server log has the details"}


def test_a_stream_that_fails_after_its_first_step_ends_without_the_text(server: Server) -> None:
    url = f"{server.url}/v1/models/leakystream:stream"
    response = HTTP.post(url, json={"instances": ["a"]}, timeout=30)
    assert response.status_code == 200
    assert response.text.startswith('data: {"predictions":["A"]}')
    assert "event: error" in response.text and "model_error" in response.text
    assert "sk-live" not in response.text


def test_a_websocket_message_is_answered_without_the_text(server: Server) -> None:
    if server.args[server.args.index("--arch") + 1] == "sync":  # no WebSocket streams: the handshake is refused
        assert HTTP.get(f"{server.url}/v1/models/leaky/ws", timeout=30).status_code == 501
        return

    async def exchange() -> dict[str, object]:
        url = server.url.replace("http://", "ws://") + "/v1/models/leaky/ws"
        async with connect(url, open_timeout=30) as websocket:
            await websocket.send(json.dumps({"id": "m1", "instances": ["secret"]}))
            return dict(json.loads(await asyncio.wait_for(websocket.recv(), 30)))

    answer = asyncio.run(exchange())
    assert answer["id"] == "m1" and "sk-live" not in json.dumps(answer)
    assert error_fields(answer)["code"] == "model_error"


def test_expose_errors_tells_the_client_whose_request_was_computed_alone(exposing: Server) -> None:
    response = predict(exposing, ["secret", "x"])  # two instances: a batch of its own
    assert response.status_code == 500
    assert error_fields(response.json())["message"] == (
        f"model 'leaky' raised in predict; the server log has the details: RuntimeError: cannot reach {SECRET}"
    )


def test_in_a_shared_batch_no_client_reads_another_ones_input(exposing: Server) -> None:
    """Isolation off (the model's choice), `--expose-errors` on: A's input fails the batch it shares with B; both
    get the error, neither reads the text, which quotes A's input."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda instances: predict(exposing, instances), [["A-ssn-123-45-6789"], ["b"]])
    for response in (a, b):
        assert response.status_code == 500, response.text  # one batch: B failed with A
        assert (
            error_fields(response.json())["message"]
            == "model 'leaky' raised in predict; the server log has the details"
        )
        assert "A-ssn" not in response.text
    logged = exposing.output()
    assert "A-ssn-123-45-6789" in logged  # the text is the operator's, in the log
