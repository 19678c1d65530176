"""Streaming models on `:stream`, the same in every architecture: real servers, real sockets, Server-Sent Events.

The `Drip` test models leave a trace on disk (a line per step computed, a marker written by the generator's
`finally`) and wait on a file the test creates, so the tests observe incremental delivery and cancellation
without timing anything.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.serving import (
    HTTP,
    ROOT,
    Server,
    model_path,
    predict,
    sample,
    scrape,
    servers_per_arch,
    wait_for_file,
    wait_until,
)

STREAMING = ("drip", "async-drip")
WRITE_DEADLINE_S = 5
MODELS = (model_path("Drip"), model_path("AsyncDrip"), model_path("Echo"), "twinserve.examples.tokens:Tokens")


@pytest.fixture(scope="module")
def stream_servers() -> Iterator[dict[str, Server]]:
    def make(arch: str) -> Server:
        # The read timeout is also a stream's write deadline (test_a_client_that_never_reads_is_cut_off).
        extra = ("--workers", "1", "--threads", "8", "--model-workers", "2", "--read-timeout-s", str(WRITE_DEADLINE_S))
        return Server(MODELS, arch, *extra)

    with servers_per_arch(ARCHS, make) as started:
        yield started


@pytest.fixture(params=ARCHS)
def server(request: pytest.FixtureRequest, stream_servers: dict[str, Server]) -> Server:
    return stream_servers[request.param]


def events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    """(event name, parsed data) per Server-Sent Event, as the bytes arrive."""
    name, data = "message", list[str]()
    for line in response.iter_lines():
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data.append(line.removeprefix("data: "))
    assert not data, "the stream ended inside an event"


def open_stream(server: Server, model: str, instances: list[Any]) -> Any:
    url = f"{server.url}/v1/models/{model}:stream"
    return HTTP.stream("POST", url, json={"instances": instances}, timeout=60)


def drip(tmp_path: Path, tag: str = "a", **control: Any) -> dict[str, Any]:
    return {"dir": str(tmp_path), "tag": tag, **control}


def closed(tmp_path: Path) -> str:
    """The generator's `finally` marker, once it appears."""
    wait_for_file(tmp_path / "closed")
    return (tmp_path / "closed").read_text()


def steps_computed(tmp_path: Path) -> int:
    steps = tmp_path / "steps"
    return len(steps.read_text().splitlines()) if steps.exists() else 0


@pytest.mark.parametrize("model", STREAMING)
def test_steps_arrive_as_they_are_made(server: Server, model: str, tmp_path: Path) -> None:
    before = scrape(server)
    instances = [drip(tmp_path, "a", steps=3, gate_at=1), drip(tmp_path, "b")]
    with open_stream(server, model, instances) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["x-request-id"]
        received = events(response)
        assert next(received) == ("message", {"predictions": ["a-0", "b-0"]})
        # The first step reached us while the generator is held before its second one.
        assert not (tmp_path / "closed").exists()
        (tmp_path / "release").touch()
        assert list(received) == [
            ("message", {"predictions": ["a-1", "b-1"]}),
            ("message", {"predictions": ["a-2", "b-2"]}),
            ("end", {}),
        ]
    assert closed(tmp_path) == "finished after 3 steps"
    after = scrape(server)
    labels = {"model": model, "endpoint": "stream"}
    counted = sample(after, "twinserve_requests_total", code="200", **labels)
    assert counted - sample(before, "twinserve_requests_total", code="200", **labels) == 1
    first = "twinserve_time_to_first_chunk_seconds_count"
    assert sample(after, first, model=model) - sample(before, first, model=model) == 1


@pytest.mark.parametrize("model", STREAMING)
def test_client_leaving_closes_the_generator(server: Server, model: str, tmp_path: Path) -> None:
    endless = 100_000  # steps it would take if nothing stopped it
    left = {"model": model, "endpoint": "stream", "code": "499"}
    left_before = sample(scrape(server), "twinserve_requests_total", **left)
    with open_stream(server, model, [drip(tmp_path, steps=endless, pause_s=0.01)]) as response:
        received = events(response)
        assert next(received) == ("message", {"predictions": ["a-0"]})
        assert next(received) == ("message", {"predictions": ["a-1"]})
    # Leaving the block closed the connection: the server stops asking for steps and closes the generator.
    marker = closed(tmp_path)
    assert marker.startswith("stopped early after ")
    stopped_at = int(marker.split()[3])
    assert 2 <= stopped_at < endless
    assert steps_computed(tmp_path) == stopped_at  # nothing was computed after the generator was closed
    # Counted once, as a request whose client left (it is counted just after the generator is closed).
    deadline = time.monotonic() + 30
    while sample(scrape(server), "twinserve_requests_total", **left) == left_before:
        assert time.monotonic() < deadline, "the abandoned stream was never counted"
        time.sleep(0.05)
    assert sample(scrape(server), "twinserve_requests_total", **left) == left_before + 1
    # The server (and, in hybrid, the model worker that held the stream) serves the next stream.
    again = tmp_path / "again"
    again.mkdir()
    with open_stream(server, model, [drip(again, steps=2)]) as response:
        assert [name for name, _ in events(response)] == ["message", "message", "end"]
    assert HTTP.get(server.url + "/v2/health/ready").status_code == 200


@pytest.mark.parametrize("model", STREAMING)
def test_a_client_that_never_reads_is_cut_off(server: Server, model: str, tmp_path: Path) -> None:
    # A client that stops reading held its stream, and in hybrid the model worker, for as long as it stayed
    # connected (issue #44: hybrid's model timed out for everyone else while one such client was connected). Each
    # step here is 256 KiB and the client's receive buffer 4 KiB: two or three steps fill what the sockets hold.
    endless = 10_000
    body = json.dumps({"instances": [drip(tmp_path, tag="x" * 262_144, steps=endless)]}).encode()
    head = f"POST /v1/models/{model}:stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    left = {"model": model, "endpoint": "stream", "code": "499"}
    left_before = sample(scrape(server), "twinserve_requests_total", **left)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        # Never read: the write deadline (the read timeout) closes the generator, wherever it runs.
        wait_for_file(tmp_path / "closed", timeout=WRITE_DEADLINE_S + 60)
        marker = (tmp_path / "closed").read_text()
        assert marker.startswith("stopped early after ") and int(marker.split()[3]) < endless, marker
        wait_until(
            lambda: sample(scrape(server), "twinserve_requests_total", **left) == left_before + 1,
            timeout=30,
            what="the stalled stream counted as the client's (499)",
        )
        # Still connected, the model (in hybrid, its workers) serves everyone else.
        again = tmp_path / "again"
        again.mkdir()
        with open_stream(server, model, [drip(again, steps=2)]) as response:
            assert [name for name, _ in events(response)] == ["message", "message", "end"]


def test_a_hybrid_stream_whose_client_stops_reading_lets_its_model_worker_go(tmp_path: Path) -> None:
    """Hybrid's one model worker is not held for a client that stops reading: the steps are read ahead into a
    bounded buffer (core/executors.py `STREAM_BUFFER`), and once it is full the stream is closed and the worker
    serves the next request, though the stalled client is still connected and its write deadline (10 minutes
    here) is far off."""
    endless = 100_000
    body = json.dumps({"instances": [drip(tmp_path, tag="x" * 65_536, steps=endless)]}).encode()
    head = "POST /v1/models/drip:stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with (
        Server(MODELS, "hybrid", "--model-workers", "1", "--read-timeout-s", "600") as server,
        socket.socket() as sock,
    ):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # never read
        marker = closed(tmp_path)
        assert marker.startswith("stopped early after ") and int(marker.split()[3]) < endless, marker
        beside = tmp_path / "beside"
        beside.mkdir()
        with open_stream(server, "drip", [drip(beside, steps=2)]) as response:  # the one worker, free again
            assert [name for name, _ in events(response)] == ["message", "message", "end"]
        answer = predict(server, "echo", [1, 2])
        assert answer.status_code == 200 and answer.json() == {"predictions": [1, 2]}


@pytest.mark.parametrize("model", STREAMING)
def test_error_mid_stream_is_an_error_event(server: Server, model: str, tmp_path: Path) -> None:
    with open_stream(server, model, [drip(tmp_path, steps=5, fail_at=2)]) as response:
        assert response.status_code == 200
        received = list(events(response))
        request_id = response.headers["x-request-id"]
    assert received[:2] == [("message", {"predictions": ["a-0"]}), ("message", {"predictions": ["a-1"]})]
    name, body = received[2]
    assert name == "error" and len(received) == 3
    assert error_fields(body)["code"] == "model_error"
    # The model's own text is the log's (tests/live/test_model_errors.py): the event says what failed and where.
    assert error_fields(body)["message"] == f"model {model!r} raised in predict; the server log has the details"
    assert error_fields(body)["request_id"] == request_id
    server.wait_for_output("step 2 failed on purpose")
    assert closed(tmp_path) == "failed after 2 steps"


def test_wrong_step_size_is_an_error_event(server: Server, tmp_path: Path) -> None:
    with open_stream(server, "drip", [drip(tmp_path, steps=5, bad_at=1)]) as response:
        received = list(events(response))
    assert received[0] == ("message", {"predictions": ["a-0"]})
    assert received[1][0] == "error" and error_fields(received[1][1])["code"] == "output_mismatch"
    assert len(received) == 2
    assert closed(tmp_path) == "stopped early after 2 steps"  # the generator was closed, not left suspended


@pytest.mark.parametrize("model", STREAMING)
def test_errors_before_the_first_step_are_plain_http_errors(server: Server, model: str, tmp_path: Path) -> None:
    with open_stream(server, model, [drip(tmp_path, fail_at=0)]) as response:
        response.read()
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert error_fields(response.json())["code"] == "model_error"
    url = f"{server.url}/v1/models/{model}:stream"
    invalid = HTTP.post(url, json={"instances": [{"steps": 2}]}, timeout=30)
    assert invalid.status_code == 422 and error_fields(invalid.json())["code"] == "validation_failed"
    missing = HTTP.post(f"{server.url}/v1/models/nope:stream", json={"instances": [1]}, timeout=30)
    assert missing.status_code == 404 and error_fields(missing.json())["code"] == "model_not_found"


def test_stream_of_a_non_streaming_model_is_refused(server: Server) -> None:
    response = HTTP.post(f"{server.url}/v1/models/echo:stream", json={"instances": [1]}, timeout=30)
    assert response.status_code == 400
    error = error_fields(response.json())
    assert error["code"] == "not_streaming" and "use :predict" in error["message"]
    assert error["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize("model", STREAMING)
def test_predict_on_a_streaming_model_collects_the_steps(server: Server, model: str, tmp_path: Path) -> None:
    response = predict(server, model, [drip(tmp_path, "a", steps=2), drip(tmp_path, "b")])
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": [["a-0", "a-1"], ["b-0", "b-1"]]}
    meta = HTTP.get(f"{server.url}/v1/models/{model}").json()
    assert meta["streams"] is True
    assert HTTP.get(f"{server.url}/v1/models/echo").json()["streams"] is False
    paths = HTTP.get(server.url + "/openapi.json").json()["paths"]
    assert f"/v1/models/{model}:stream" in paths and "/v1/models/echo:stream" not in paths


def test_streams_are_the_same_in_every_architecture(stream_servers: dict[str, Server]) -> None:
    prompts = [{"text": "Why stream?", "max_tokens": 5}, {"text": "hello", "max_tokens": 3}]
    v2_request = {
        "inputs": [{"name": "input", "datatype": "BYTES", "shape": [2], "data": list(map(json.dumps, prompts))}]
    }
    answers = []
    for server in stream_servers.values():
        with open_stream(server, "tokens", prompts) as response:
            answers.append(list(events(response)))
        # V2 infer on a streaming model collects its steps, as :predict does.
        steps = [data["predictions"] for _, data in answers[-1][:-1]]
        v2 = HTTP.post(f"{server.url}/v2/models/tokens/infer", json=v2_request, timeout=30)
        assert v2.status_code == 200, v2.text
        assert v2.json()["outputs"][0]["shape"] == [2, 5]
        assert v2.json()["outputs"][0]["data"] == [step[0] for step in steps] + [step[1] for step in steps]
    assert answers[0] == answers[1] == answers[2]
    assert len(answers[0]) == 6 and answers[0][-1] == ("end", {})
    assert answers[0][4][1]["predictions"][1] == ""  # the shorter answer is complete: empty chunks


def test_model_worker_dying_mid_stream(stream_servers: dict[str, Server], tmp_path: Path) -> None:
    server = stream_servers["hybrid"]
    with open_stream(server, "drip", [drip(tmp_path, steps=5, die_at=1)]) as response:
        received = list(events(response))
    assert received[0] == ("message", {"predictions": ["a-0"]})
    assert received[1][0] == "error" and error_fields(received[1][1])["code"] == "worker_died"
    # The pool replaces the worker; streams keep working.
    again = tmp_path / "again"
    again.mkdir()
    with open_stream(server, "drip", [drip(again, steps=2)]) as response:
        assert [name for name, _ in events(response)] == ["message", "message", "end"]


def test_example_client_prints_the_tokens(stream_servers: dict[str, Server]) -> None:
    server = stream_servers["async"]
    prompt = {"text": "Why stream?", "max_tokens": 6}
    collected = predict(server, "tokens", [prompt]).json()["predictions"][0]
    client = ROOT / "examples" / "clients" / "sse_client.py"
    args = [sys.executable, str(client), "--url", server.url, "--model", "tokens", json.dumps(prompt)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == collected
    refused = subprocess.run(
        [*args[:-3], "--model", "echo", "1"], capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 1 and "not_streaming" in refused.stderr


@pytest.mark.parametrize("arch", ARCHS)
def test_sigterm_lets_a_stream_finish_within_the_graceful_timeout_and_cuts_an_endless_one(
    arch: str, tmp_path: Path
) -> None:
    """A graceful stop (SIGTERM) treats a stream as a request in flight: one that ends within `--graceful-timeout`
    sends every step and its `end` event; one that would not end is cut when the timeout is up, its chunked body
    left unterminated (RFC 9112 section 7.1: the client sees an incomplete message, never a clean end), and the
    server exits 0."""
    finite, endless = tmp_path / "finite", tmp_path / "endless"
    finite.mkdir()
    endless.mkdir()
    steps = 15
    with Server(MODELS, arch, "--workers", "1", "--graceful-timeout", "4") as server:
        with (
            open_stream(server, "async-drip", [drip(endless, steps=100_000, pause_s=0.05)]) as cut,
            open_stream(server, "drip", [drip(finite, steps=steps, pause_s=0.1)]) as whole,
        ):
            cut_events, whole_events = events(cut), events(whole)
            assert next(cut_events)[0] == "message" and next(whole_events)[0] == "message"
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            assert list(whole_events) == [
                *(("message", {"predictions": [f"a-{i}"]}) for i in range(1, steps)),
                ("end", {}),
            ]
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in cut_events:
                    pass
        assert server.process.wait(timeout=60) == 0
    assert closed(finite) == f"finished after {steps} steps"
