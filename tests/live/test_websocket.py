"""`/v1/models/{model}/ws` on real servers, driven by the `websockets` client library.

OpenSockets are served by the async and hybrid architectures (every shared behaviour runs on both); the sync
architecture answers 501. A few in-process tests (starlette's TestClient) reach what uvicorn stops first.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.errors import error_fields
from tests.serving import HTTP, Server, model_path, predict, sample, scrape, wait_for_file, wait_until
from twinserve.config import Config
from twinserve.core.runtime import load_runtimes
from twinserve.fronts.asgi import create_asgi_app
from twinserve.service.contract import Service

STREAM_ARCHS = ("async", "hybrid")
IRIS = "twinserve.examples.tabular:Classifier"
MAX_PENDING = 8
MAX_MESSAGE_BYTES = 4096
WRITE_DEADLINE_S = 5
FLOWERS = [
    {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2},
    {"sepal_length": 6.4, "sepal_width": 3.2, "petal_length": 4.5, "petal_width": 1.5},
    {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5},
    {"sepal_length": 5.8, "sepal_width": 2.7, "petal_length": 5.1, "petal_width": 1.9},
]


@pytest.fixture(scope="module", params=STREAM_ARCHS)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    models = [IRIS, *(model_path(name) for name in ("Echo", "BatchRecorder", "Gate"))]
    flags = ["--workers", "1", "--ws-max-pending", str(MAX_PENDING), "--ws-max-message-bytes", str(MAX_MESSAGE_BYTES)]
    flags += ["--read-timeout-s", str(WRITE_DEADLINE_S)]  # also the write deadline (test_a_client_that_never_reads)
    with Server(models, request.param, *flags) as started:
        yield started


def ws_url(server: Server, model: str) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/models/{model}/ws"


@asynccontextmanager
async def stream(server: Server, model: str) -> AsyncIterator[ClientConnection]:
    async with connect(ws_url(server, model), open_timeout=30) as websocket:
        yield websocket


async def answer(websocket: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    received = await asyncio.wait_for(websocket.recv(), timeout)
    assert isinstance(received, str)  # a text message is answered with text
    reply: dict[str, Any] = json.loads(received)
    return reply


def flowers(socket: int, message: int) -> list[dict[str, float]]:
    """One to three flowers, different per message."""
    start = (socket * 7 + message) % len(FLOWERS)
    return [FLOWERS[(start + k) % len(FLOWERS)] for k in range(1 + message % 3)]


async def converse(server: Server, model: str, messages: list[list[Any]], window: int) -> dict[str, dict[str, Any]]:
    """Send every message on one socket, at most `window` unanswered at once; the answers by id."""
    answers: dict[str, dict[str, Any]] = {}
    async with stream(server, model) as websocket:
        sent = 0
        while len(answers) < len(messages):
            while sent < len(messages) and sent - len(answers) < window:
                await websocket.send(json.dumps({"id": f"m{sent}", "instances": messages[sent]}))
                sent += 1
            reply = await answer(websocket)
            assert reply["id"] not in answers
            answers[reply["id"]] = reply
    return answers


def test_many_sockets_stream_and_every_answer_equals_the_http_answer(server: Server) -> None:
    sockets, per_socket = 8, 20
    conversations = [[flowers(s, m) for m in range(per_socket)] for s in range(sockets)]

    async def run() -> list[dict[str, dict[str, Any]]]:
        return list(await asyncio.gather(*(converse(server, "iris", c, MAX_PENDING) for c in conversations)))

    results = asyncio.run(run())
    expected: dict[str, Any] = {}
    for conversation, answers in zip(conversations, results, strict=True):
        assert set(answers) == {f"m{i}" for i in range(per_socket)}
        for i, instances in enumerate(conversation):
            key = json.dumps(instances)
            if key not in expected:
                response = predict(server, "iris", instances)
                assert response.status_code == 200
                expected[key] = response.json()["predictions"]
            assert answers[f"m{i}"] == {"id": f"m{i}", "predictions": expected[key]}


def test_messages_from_different_sockets_share_batches(server: Server) -> None:
    before = scrape(server)

    async def run() -> list[dict[str, dict[str, Any]]]:
        # BatchRecorder computes for 20 ms per batch: what arrives meanwhile, from any socket, forms the next one.
        conversations = [[[f"s{s}-{m}"] for m in range(MAX_PENDING)] for s in range(6)]
        return list(await asyncio.gather(*(converse(server, "batchrecorder", c, MAX_PENDING) for c in conversations)))

    results = asyncio.run(run())
    sockets_per_call: dict[str, set[str]] = {}
    for answers in results:
        for reply in answers.values():
            (output,) = reply["predictions"]
            sockets_per_call.setdefault(output["call"], set()).add(output["input"].split("-")[0])
    assert max(len(s) for s in sockets_per_call.values()) > 1  # one predict call served several sockets
    after = scrape(server)

    def grew(name: str) -> float:
        return sample(after, name, model="batchrecorder") - sample(before, name, model="batchrecorder")

    assert grew("twinserve_batch_size_sum") == 6 * MAX_PENDING
    assert grew("twinserve_batch_size_sum") / grew("twinserve_batch_size_count") > 1
    counted = sample(after, "twinserve_requests_total", model="batchrecorder", endpoint="websocket", code="200")
    assert (
        counted - sample(before, "twinserve_requests_total", model="batchrecorder", endpoint="websocket", code="200")
        == 6 * MAX_PENDING
    )


def test_a_message_past_the_pending_bound_is_refused_at_once(server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def run() -> None:
        async with stream(server, "gate") as websocket:
            for i in range(MAX_PENDING):
                await websocket.send(json.dumps({"id": f"held{i}", "instances": [{"gate": str(gate)}]}))
            await asyncio.to_thread(wait_for_file, gate.with_suffix(".started"))
            await websocket.send(json.dumps({"id": "one-too-many", "instances": [{"gate": str(gate)}]}))
            refused = await answer(websocket)
            assert refused["id"] == "one-too-many"
            assert error_fields(refused)["code"] == "too_many_pending"
            assert f"--ws-max-pending {MAX_PENDING}" in error_fields(refused)["message"]
            gate.with_suffix(".release").touch()
            held = [await answer(websocket) for _ in range(MAX_PENDING)]
            assert sorted(r["id"] for r in held) == sorted(f"held{i}" for i in range(MAX_PENDING))
            assert all(r["predictions"] == ["released"] for r in held)
            # Answered, they no longer count: the socket takes messages again.
            await websocket.send(json.dumps({"id": "after", "instances": [{"gate": str(gate)}]}))
            assert await answer(websocket) == {"id": "after", "predictions": ["released"]}

    asyncio.run(run())
    rejected = sample(scrape(server), "twinserve_rejected_requests_total", model="gate", reason="websocket_pending")
    assert rejected >= 1


def _masked_text_frame(payload: bytes) -> bytes:
    """One text frame as a client sends it (RFC 6455 5.2: FIN, opcode 1, masked; 16-bit length past 125)."""
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + size.to_bytes(2, "big")
    return b"\x81" + length + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))


def test_a_client_that_never_reads_is_cut_off(server: Server) -> None:
    # A client that sends and never reads: its answers piled up in the server for as long as it stayed connected
    # (issue #44). Each answer must be taken within the write deadline (the read timeout), else it is cut off.
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        "GET /v1/models/echo/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    message = json.dumps({"id": "m", "instances": ["x" * (MAX_MESSAGE_BYTES - 100)]}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(head.encode())
        handshake = b""
        while b"\r\n\r\n" not in handshake:
            handshake += sock.recv(1)  # the 101's head only: nothing of what follows it is read
        assert handshake.startswith(b"HTTP/1.1 101"), handshake
        sock.settimeout(2)
        with contextlib.suppress(TimeoutError, ConnectionError):  # the server stopped reading: enough is owed
            for _ in range(5_000):
                sock.sendall(_masked_text_frame(message))
        wait_until(lambda: "read nothing for" in server.output(), timeout=WRITE_DEADLINE_S + 60, what="the cut-off")
        # Once read, what the server had written drains, and then the connection ends: no close frame follows.
        sock.settimeout(60)
        with contextlib.suppress(ConnectionError):
            while sock.recv(1 << 20):
                pass
    with httpx.Client(timeout=30) as client:  # the server serves on
        assert client.post(f"{server.url}/v1/models/echo:predict", json={"instances": [1]}).status_code == 200


def test_an_oversize_message_closes_the_socket_with_1009(server: Server) -> None:
    async def run() -> None:
        async with stream(server, "echo") as websocket:
            await websocket.send(json.dumps({"id": "small", "instances": ["x"]}))
            assert await answer(websocket) == {"id": "small", "predictions": ["x"]}
            await websocket.send(json.dumps({"id": "big", "instances": ["x" * MAX_MESSAGE_BYTES]}))
            with pytest.raises(ConnectionClosed) as closed:
                await answer(websocket)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    asyncio.run(run())
    assert predict(server, "echo", ["still up"]).json() == {"predictions": ["still up"]}


def test_malformed_and_invalid_messages_are_answered_with_http_errors_and_the_socket_stays_open(
    server: Server,
) -> None:
    invalid = [{"sepal_length": "long"}]
    http = predict(server, "iris", invalid)
    assert http.status_code == 422

    async def run() -> None:
        async with stream(server, "iris") as websocket:
            await websocket.send('{"id": "a", "instances": [')
            malformed = await answer(websocket)
            assert malformed["id"] is None and error_fields(malformed)["code"] == "malformed_json"
            await websocket.send(json.dumps({"id": "b", "instances": invalid}))
            rejected = await answer(websocket)
            assert rejected["id"] == "b"
            assert error_fields(rejected) == {**error_fields(http.json()), "request_id": "b"}
            await websocket.send(json.dumps({"id": "c", "instance": FLOWERS}))
            shape = await answer(websocket)
            assert shape["id"] == "c" and error_fields(shape)["code"] == "validation_failed"
            await websocket.send(json.dumps(["not", "an", "object"]))
            assert error_fields(await answer(websocket))["code"] == "validation_failed"
            for literal in ("NaN", "Infinity", "1e400"):  # not JSON: 400 over HTTP, the same here
                await websocket.send('{"id": "n", "instances": [{"sepal_length": ' + literal + "}]}")
                number = await answer(websocket)
                assert number["id"] is None and error_fields(number)["code"] == "malformed_json", number  # unreadable
            await websocket.send(json.dumps({"id": "d", "instances": FLOWERS[:1]}))
            assert (await answer(websocket))["predictions"] == predict(server, "iris", FLOWERS[:1]).json()[
                "predictions"
            ]

    asyncio.run(run())


def frame(header: dict[str, Any], tensors: bytes = b"") -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack(">I", len(encoded)) + encoded + tensors


def unframe(message: str | bytes) -> tuple[dict[str, Any], bytes]:
    assert isinstance(message, bytes)  # a binary message is answered with binary
    (length,) = struct.unpack(">I", message[:4])
    return json.loads(message[4 : 4 + length]), message[4 + length :]


def test_binary_messages_carry_v2_tensors(server: Server) -> None:
    rows = np.array([[f[k] for k in FLOWERS[0]] for f in FLOWERS], dtype=np.float32)
    tensor = {"name": "input", "datatype": "FP32", "shape": list(rows.shape)}
    http = HTTP.post(
        f"{server.url}/v2/models/iris/infer", json={"id": "t1", "inputs": [{**tensor, "data": rows.tolist()}]}
    )
    assert http.status_code == 200

    async def run() -> None:
        async with stream(server, "iris") as websocket:
            binary_in = {**tensor, "parameters": {"binary_data_size": rows.nbytes}}
            await websocket.send(frame({"id": "t1", "inputs": [binary_in]}, rows.tobytes()))
            header, rest = unframe(await websocket.recv())
            assert header == http.json() and rest == b""
            # Outputs as binary data too: the probabilities come back as raw FP32 rows.
            asked = {
                "id": "t2",
                "inputs": [binary_in],
                "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
            }
            await websocket.send(frame(asked, rows.tobytes()))
            header, rest = unframe(await websocket.recv())
            (output,) = header["outputs"]
            assert header["id"] == "t2" and output["parameters"]["binary_data_size"] == len(rest)
            probabilities = np.frombuffer(rest, dtype=np.float32).reshape(output["shape"])
            expected = next(o for o in http.json()["outputs"] if o["name"] == "probabilities")["data"]
            np.testing.assert_allclose(probabilities.ravel(), expected)
            # A tensor that does not match the model: the HTTP contract's 400, framed, with the id.
            await websocket.send(frame({"id": "t3", "inputs": [{**binary_in, "datatype": "FP64"}]}, rows.tobytes()))
            header, rest = unframe(await websocket.recv())
            assert header["id"] == "t3" and error_fields(header)["code"] == "invalid_tensor" and rest == b""
            await websocket.send(b"\x00\x00\x10\x00{}")
            header, _ = unframe(await websocket.recv())
            assert header["id"] is None and error_fields(header)["code"] == "malformed_json"

    asyncio.run(run())


def test_a_client_leaving_mid_stream_cancels_its_queued_messages(server: Server, tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    def gate_stats() -> dict[str, Any]:
        stats: dict[str, Any] = HTTP.get(f"{server.url}/v1/models/gate").json()["serving"]
        return stats

    cancelled_before = gate_stats()["batches"]["cancelled"]

    async def run() -> None:
        websocket = await connect(ws_url(server, "gate"), open_timeout=30)
        # One message computes (the model worker is held at the gate); the three sent after it queue behind it.
        for i in range(4):
            await websocket.send(json.dumps({"id": f"m{i}", "instances": [{"gate": str(gate)}]}))
            if i == 0:
                await asyncio.to_thread(wait_for_file, gate.with_suffix(".started"))
        for _ in range(1500):
            if (await asyncio.to_thread(gate_stats))["queued_instances"] == 3:
                break
            await asyncio.sleep(0.02)
        assert (await asyncio.to_thread(gate_stats))["queued_instances"] == 3
        await websocket.close()

    asyncio.run(run())
    gate.with_suffix(".release").touch()
    assert predict(server, "echo", ["still up"]).json() == {"predictions": ["still up"]}
    deadline_polls = 500
    for _ in range(deadline_polls):
        stats = gate_stats()
        in_flight = sample(scrape(server), "twinserve_in_flight_requests")
        if stats["batches"]["cancelled"] - cancelled_before == 3 and in_flight == 0:  # a scrape is not counted
            break
        asyncio.run(asyncio.sleep(0.02))
    assert stats["batches"]["cancelled"] - cancelled_before == 3
    assert stats["queued_instances"] == 0
    assert in_flight == 0
    assert predict(server, "gate", [{"gate": str(gate)}]).json() == {"predictions": ["released"]}


def test_the_handshake_is_refused_for_an_unknown_model_and_a_plain_get_needs_the_upgrade(server: Server) -> None:
    async def run() -> None:
        with pytest.raises(InvalidStatus) as refused:
            async with stream(server, "nope"):
                pass
        response = refused.value.response
        assert response.status_code == 404
        assert error_fields(json.loads(response.body or b""))["code"] == "model_not_found"

    asyncio.run(run())
    assert "without completing handshake" not in server.output()  # uvicorn's noise after a refusal is dropped
    plain = HTTP.get(ws_url(server, "iris").replace("ws://", "http://"))
    assert plain.status_code == 426 and plain.headers["upgrade"] == "websocket"
    assert error_fields(plain.json())["code"] == "upgrade_required"
    documented = HTTP.get(f"{server.url}/openapi.json").json()["paths"]["/v1/models/iris/ws"]["get"]
    assert "ws-max-pending" in documented["description"] and "501" in documented["responses"]


def test_sync_answers_501() -> None:
    with Server([IRIS], "sync", "--workers", "1") as server:
        url = f"{server.url}/v1/models/iris/ws"
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}  # fmt: skip
        for headers in ({}, upgrade):
            response = HTTP.get(url, headers=headers)
            assert response.status_code == 501
            error = error_fields(response.json())
            assert error["code"] == "websocket_unsupported"
            assert "--arch async" in error["message"] and "hybrid" in error["message"]

        async def run() -> None:
            with pytest.raises(InvalidStatus) as refused:
                async with stream(server, "iris"):
                    pass
            assert refused.value.response.status_code == 501

        asyncio.run(run())


@pytest.mark.parametrize("arch", STREAM_ARCHS)
def test_sigterm_sends_the_answers_owed_then_closes_with_1001(arch: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    server = Server([model_path("Gate")], arch, "--workers", "1", "--graceful-timeout", "60")

    async def run() -> None:
        async with stream(server, "gate") as websocket:
            await websocket.send(json.dumps({"id": "owed", "instances": [{"gate": str(gate)}]}))
            await asyncio.to_thread(wait_for_file, gate.with_suffix(".started"))
            server.terminate()
            await asyncio.to_thread(server.wait_for_output, "draining 1 WebSocket stream")
            await websocket.send(json.dumps({"id": "late", "instances": [{"gate": str(gate)}]}))
            late = await answer(websocket)
            assert late["id"] == "late" and error_fields(late)["code"] == "shutting_down"
            gate.with_suffix(".release").touch()
            assert await answer(websocket) == {"id": "owed", "predictions": ["released"]}
            with pytest.raises(ConnectionClosed) as closed:
                await answer(websocket)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001

    with server:
        asyncio.run(run())
        assert server.process is not None
        assert server.process.wait(timeout=60) == 0


def test_the_front_enforces_the_message_limit_itself_and_refuses_unknown_models() -> None:
    """In process (no uvicorn, whose own limit closes first on a real server): the front's checks alone."""
    config = Config(arch="async", models=[model_path("Echo")], ws_max_message_bytes=64)
    app = create_asgi_app(Service(load_runtimes(config), config))
    # localhost: TestClient's own `testserver` is not a host the default (loopback) --allowed-hosts serve.
    with TestClient(app) as client:
        with client.websocket_connect("ws://localhost/v1/models/echo/ws") as websocket:
            websocket.send_text(json.dumps({"id": "a", "instances": ["x"]}))
            assert websocket.receive_json() == {"id": "a", "predictions": ["x"]}
            # 60 characters but 90 bytes: the limit is in bytes.
            websocket.send_text(json.dumps({"id": "b", "instances": ["é" * 30]}, ensure_ascii=False))
            with pytest.raises(WebSocketDisconnect) as closed:
                websocket.receive_text()
            assert closed.value.code == 1009
        with (
            pytest.raises(WebSocketDenialResponse) as denied,
            client.websocket_connect("ws://localhost/v1/models/nope/ws"),
        ):
            pass
        assert denied.value.status_code == 404
        assert error_fields(denied.value.json())["code"] == "model_not_found"


def test_a_client_address_holds_a_bounded_number_of_sockets() -> None:
    """In process: past `--ws-max-per-client` open sockets from one address, a handshake is 429 (issue #44: no cap);
    closing one lets the next in. TestClient's sockets all come from its one address."""
    config = Config(arch="async", models=[model_path("Echo")], ws_max_per_client=2)
    app = create_asgi_app(Service(load_runtimes(config), config))
    url = "ws://localhost/v1/models/echo/ws"
    with TestClient(app) as client, client.websocket_connect(url) as first:
        with client.websocket_connect(url) as second:
            second.send_text(json.dumps({"id": "2", "instances": ["x"]}))
            assert second.receive_json() == {"id": "2", "predictions": ["x"]}
            with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect(url):
                pass
            assert denied.value.status_code == 429 and denied.value.headers["retry-after"] == "1"
            assert "--ws-max-per-client" in error_fields(denied.value.json())["message"]
        with client.websocket_connect(url) as third:  # the second closed: room again
            third.send_text(json.dumps({"id": "3", "instances": ["y"]}))
            assert third.receive_json() == {"id": "3", "predictions": ["y"]}
        first.send_text(json.dumps({"id": "1", "instances": ["z"]}))
        assert first.receive_json() == {"id": "1", "predictions": ["z"]}
