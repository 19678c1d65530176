"""Limits on everything a client controls, each answered with its own status and code in every architecture.

Request-line and header limits are enforced by the HTTP server while it parses (twinserve's own parsers on
httptools, servers/http1.py), so those answers carry twinserve's body but close the connection.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.serving import HTTP, Server, model_path, predict, servers_per_arch, wait_for_file

MAX_BODY, MAX_INSTANCES, MAX_ELEMENTS = 4096, 8, 20
MAX_LINE, MAX_HEADERS, MAX_HEADER_BYTES, MAX_TIMEOUT_MS = 1024, 30, 2048, 300
SAME_PROCESS = {"sync": ["--threads", "8"], "async": [], "hybrid": []}


@pytest.fixture(scope="module")
def limited() -> Iterator[dict[str, Server]]:
    """One server per architecture with every client limit set low (and neither API keys nor CORS)."""

    def make(arch: str) -> Server:
        return Server(
            [model_path("Echo"), model_path("Affine"), model_path("Gate")],
            arch,
            "--workers",
            "1",
            "--model-workers",
            "1",
            "--max-batch-size",
            "2",
            *SAME_PROCESS[arch],
            *("--max-body-bytes", str(MAX_BODY), "--max-instances", str(MAX_INSTANCES)),
            *("--max-tensor-elements", str(MAX_ELEMENTS), "--max-request-line", str(MAX_LINE)),
            *("--max-header-count", str(MAX_HEADERS), "--max-header-bytes", str(MAX_HEADER_BYTES)),
            *("--max-timeout-ms", str(MAX_TIMEOUT_MS)),
        )

    with servers_per_arch(ARCHS, make) as started:
        yield started


@pytest.fixture(params=ARCHS)
def server(request: pytest.FixtureRequest, limited: dict[str, Server]) -> Server:
    return limited[request.param]


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = error_fields(response.json())
    assert error["code"] == code and error["request_id"] == response.headers["x-request-id"]
    return str(error["message"])


def affine(server: Server, rows: int) -> httpx.Response:
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP64", "shape": [rows, 2], "data": [[1.0, 2.0]] * rows},
            {"name": "scale", "datatype": "FP64", "shape": [rows], "data": [2.0] * rows},
        ]
    }
    return HTTP.post(server.url + "/v2/models/affine/infer", json=body, timeout=30)


def test_body_size(server: Server) -> None:
    assert predict(server, "echo", ["x" * (MAX_BODY // 2)]).status_code == 200
    message = assert_error(predict(server, "echo", ["x" * MAX_BODY]), 413, "payload_too_large")
    assert "--max-body-bytes" in message

    def chunks() -> Iterator[bytes]:
        yield b'{"instances": ["'
        yield b"x" * MAX_BODY
        yield b'"]}'

    chunked = HTTP.post(server.url + "/v1/models/echo:predict", content=chunks(), timeout=30)
    assert_error(chunked, 413, "payload_too_large")


def test_instances_per_request(server: Server) -> None:
    assert predict(server, "echo", list(range(MAX_INSTANCES))).status_code == 200
    message = assert_error(predict(server, "echo", list(range(MAX_INSTANCES + 1))), 413, "too_many_instances")
    assert f"at most {MAX_INSTANCES} instances" in message and "--max-instances" in message
    # The limit comes before the model's schema: even invalid instances are refused for their number.
    assert_error(predict(server, "affine", [None]), 422, "validation_failed")
    assert_error(predict(server, "affine", [None] * (MAX_INSTANCES + 1)), 413, "too_many_instances")


def test_v2_rows_and_tensor_elements(server: Server) -> None:
    six = affine(server, 6)  # 6 x 2 + 6 = 18 elements
    assert six.status_code == 200, six.text
    assert six.json()["outputs"][0]["shape"] == [6, 2]
    seven = affine(server, 7)  # 7 x 2 + 7 = 21 elements
    assert seven.status_code == 413 and list(seven.json()) == ["error"]
    assert f"at most {MAX_ELEMENTS}" in seven.json()["error"] and "--max-tensor-elements" in seven.json()["error"]
    # A declared shape is enough: elements are counted before any data is decoded.
    huge = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [10**12, 2], "data": [1.0]}]}
    refused = HTTP.post(server.url + "/v2/models/affine/infer", json=huge, timeout=30)
    assert refused.status_code == 413 and "--max-tensor-elements" in refused.json()["error"]
    rows = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [3, 2], "data": [1.0] * 6}]}
    ok = HTTP.post(server.url + "/v2/models/affine/infer", json=rows, timeout=30)
    assert ok.status_code == 400 and "scale" in ok.json()["error"]  # under the limit: on to the usual checks


def test_v2_rows_per_request(server: Server) -> None:
    rows = MAX_INSTANCES + 1
    body = {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [rows], "data": ["1"] * rows}]}
    response = HTTP.post(server.url + "/v2/models/echo/infer", json=body, timeout=30)
    assert response.status_code == 413, response.text
    assert f"at most {MAX_INSTANCES} rows" in response.json()["error"]


def _read_answer(sock: socket.socket, received: bytes = b"") -> tuple[int, bytes, bytes]:
    """One whole answer (a `100 Continue` before it skipped): status, body, and what followed it."""
    while True:
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed mid-answer: {received!r}"
            received += chunk
        head, _, rest = received.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 100:
            received = rest
            continue
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, "the connection closed mid-body"
            rest += chunk
        return status, rest[:length], rest[length:]


def _echo_head(body: bytes, *extra: str) -> bytes:
    lines = ["POST /v1/models/echo:predict HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    return ("\r\n".join([*lines, f"Content-Length: {len(body)}", *extra]) + "\r\n\r\n").encode()


def test_a_body_is_read_however_it_arrives(server: Server) -> None:
    """Whole in one write (the async front then takes it from the server as it stands), its head and body in two
    writes, a byte at a time, behind `Expect: 100-continue` (uvicorn writes the 100 once the app waits for the
    body; RFC 9110 section 10.1.1: a client may also send the body without waiting for it),
    and two requests pipelined in one write: each on one kept-alive connection, each answered with its own
    instances, none of one request's body seen by the next."""
    bodies = [json.dumps({"instances": [f"r{i}", i]}).encode() for i in range(6)]

    def answers(body: bytes) -> list[Any]:
        return [f"r{bodies.index(body)}", bodies.index(body)]

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each write its own segment, not coalesced
        sock.sendall(_echo_head(bodies[0]) + bodies[0])  # whole
        status, answer, rest = _read_answer(sock)
        assert (status, json.loads(answer)["predictions"], rest) == (200, answers(bodies[0]), b"")

        sock.sendall(_echo_head(bodies[1]))  # the head, then the body in a write of its own
        sock.sendall(bodies[1])
        status, answer, rest = _read_answer(sock)
        assert (status, json.loads(answer)["predictions"], rest) == (200, answers(bodies[1]), b"")

        sock.sendall(_echo_head(bodies[2]))  # a byte at a time
        for byte in bodies[2]:
            sock.sendall(bytes([byte]))
        status, answer, rest = _read_answer(sock)
        assert (status, json.loads(answer)["predictions"], rest) == (200, answers(bodies[2]), b"")

        sock.sendall(_echo_head(bodies[3], "Expect: 100-continue"))
        sock.settimeout(1.0)
        with contextlib.suppress(TimeoutError):
            early = sock.recv(65536)
            assert early.startswith(b"HTTP/1.1 100 "), early
        sock.settimeout(30)
        sock.sendall(bodies[3])
        status, answer, rest = _read_answer(sock)
        assert (status, json.loads(answer)["predictions"], rest) == (200, answers(bodies[3]), b"")

        sock.sendall(_echo_head(bodies[4]) + bodies[4] + _echo_head(bodies[5]) + bodies[5])  # pipelined
        status, answer, rest = _read_answer(sock)
        assert (status, json.loads(answer)["predictions"]) == (200, answers(bodies[4]))
        status, answer, rest = _read_answer(sock, rest)
        assert (status, json.loads(answer)["predictions"], rest) == (200, answers(bodies[5]), b"")


def _raw(server: Server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (httpx would refuse some of these requests) and read the whole answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        # Refused before it was all sent? The answer is already on its way.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
            if b"\r\n\r\n" in received:
                head, _, body = received.partition(b"\r\n\r\n")
                headers = dict(
                    line.decode().lower().split(": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
                )
                if len(body) >= int(headers.get("content-length", "0")):
                    break
    status = int(head.split(b" ", 2)[1])
    return status, headers, body


def _get(path: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("path", "headers", "status", "code"),
    [
        ("/v1/models?q=" + "a" * (MAX_LINE - 100), [], 200, None),
        ("/v1/models?q=" + "a" * (MAX_LINE + 100), [], 414, "uri_too_long"),
        ("/v1/models", [(f"X-H{i}", "v") for i in range(MAX_HEADERS - 2)], 200, None),
        ("/v1/models", [(f"X-H{i}", "v") for i in range(MAX_HEADERS + 10)], 431, "headers_too_large"),
        ("/v1/models", [("X-Big", "v" * (MAX_HEADER_BYTES - 100))], 200, None),
        ("/v1/models", [("X-Big", "v" * (MAX_HEADER_BYTES + 100))], 431, "headers_too_large"),
        ("/v1/models", [("X-Big", "v" * 10 * MAX_HEADER_BYTES)], 431, "headers_too_large"),
    ],
)
def test_request_line_and_headers(
    server: Server, path: str, headers: list[tuple[str, str]], status: int, code: str | None
) -> None:
    got, response_headers, body = _raw(server, _get(path, [*headers, ("Connection", "close")]))
    assert got == status, body
    if code is not None:
        assert response_headers["content-type"] == "application/json"
        error = error_fields(httpx.Response(got, content=body).json())
        assert error["code"] == code and error["request_id"] == response_headers["x-request-id"]
        assert "--max-" in error["message"]
    assert HTTP.get(server.url + "/v1/models", timeout=30).status_code == 200  # and the server carries on


def test_a_header_without_end_is_refused_before_it_ends(server: Server) -> None:
    """One header value sent on and on, never terminated: refused once it passes what the limits allow in all."""
    endless = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: " + b"v" * (MAX_HEADERS * MAX_HEADER_BYTES * 2)
    status, _, body = _raw(server, endless)
    assert status == 431, body
    assert error_fields(httpx.Response(status, content=body).json())["code"] == "headers_too_large"


def test_a_large_body_is_not_counted_as_head(server: Server) -> None:
    body = json.dumps({"instances": ["x" * (MAX_BODY - 100)]}).encode()
    head = "POST /v1/models/echo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request = (head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    status, _, answer = _raw(server, request)
    assert status == 200, answer


def test_header_answers_are_identical_in_every_architecture(limited: dict[str, Server]) -> None:
    request = _get("/v1/models", [(f"X-H{i}", "v") for i in range(MAX_HEADERS + 10)])
    answers = []
    for server in limited.values():
        status, headers, body = _raw(server, request)
        error = error_fields(httpx.Response(status, content=body).json())
        answers.append((status, headers["content-type"], headers.get("connection"), error["code"], error["message"]))
    assert answers[0] == answers[1] == answers[2]


def _gate(tmp_path: Path, name: str) -> dict[str, str]:
    return {"gate": str(tmp_path / name)}


def test_client_deadline_is_capped(server: Server, tmp_path: Path) -> None:
    """A client asking for a 10-minute deadline gets --max-timeout-ms: 504 while the model is busy."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(predict, server, "gate", [_gate(tmp_path, "busy")])
        try:
            wait_for_file(tmp_path / "busy.started")
            late = predict(server, "gate", [_gate(tmp_path, "late")], headers={"X-Request-Timeout-Ms": "600000"})
            assert_error(late, 504, "deadline_exceeded")
            v2: dict[str, Any] = {
                "parameters": {"timeout": 600_000_000},
                "inputs": [
                    {"name": "input", "datatype": "BYTES", "shape": [1], "data": [json.dumps(_gate(tmp_path, "v2"))]}
                ],
            }
            capped = HTTP.post(server.url + "/v2/models/gate/infer", json=v2, timeout=30)
            assert capped.status_code == 504, capped.text
        finally:
            (tmp_path / "busy.release").touch()
        assert busy.result(timeout=30).status_code == 200
    assert not (tmp_path / "late.started").exists() and not (tmp_path / "v2.started").exists()


def test_nothing_is_checked_without_keys_or_cors(server: Server) -> None:
    """These servers run with neither API keys nor CORS: no key is asked for, no CORS header is sent."""
    response = predict(server, "echo", [1], headers={"Origin": "https://app.example"})
    assert response.status_code == 200
    assert not [k for k in response.headers if k.startswith("access-control-")]
    preflight = HTTP.request(
        "OPTIONS",
        server.url + "/v1/models/echo:predict",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 405
    assert HTTP.get(server.url + "/openapi.json").json().get("security") is None
