"""The Open Inference Protocol over gRPC (`--grpc-port`) on real servers in every architecture, driven by NVIDIA's
`tritonclient.grpc` and by raw protobuf messages (typed contents, which tritonclient never sends)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import ARCHS
from tests.grpc_models import DATATYPES, TYPED
from tests.serving import HTTP, ROOT, Server, free_port, model_path, sample, scrape, servers_per_arch, wait_for_file
from twinserve.lab.servers import announced_grpc

KEY = "grpc-test-key-0123456789"
IDLE_S = 5
AUTH = {"x-api-key": KEY}
GRPC_MODELS = f"{ROOT}/tests/grpc_models.py"
MODELS = (
    f"{GRPC_MODELS}:EveryType",
    f"{GRPC_MODELS}:EveryTypedType",
    model_path("Affine"),
    "twinserve.examples.tokens:Tokens",
    model_path("Slow"),
    model_path("Faulty"),
)


class GrpcServer(Server):
    """A server that also serves gRPC: on a port chosen here, or with `grpc_port=0` on one it chooses itself and
    announces in its start-up line."""

    def __init__(self, arch: str, *extra: str, grpc_port: int | None = None) -> None:
        self.grpc_port = free_port() if grpc_port is None else grpc_port
        super().__init__(MODELS, arch, "--grpc-port", str(self.grpc_port), *extra)

    @property
    def target(self) -> str:
        if self.grpc_port:
            return f"127.0.0.1:{self.grpc_port}"
        announced = announced_grpc(self.output())
        assert announced is not None, self.output()
        return announced


@pytest.fixture(scope="module")
def grpc_servers() -> Iterator[dict[str, GrpcServer]]:
    def make(arch: str) -> GrpcServer:
        # The read timeout bounds a silent stream too (test_a_stream_is_not_held_for_free). `--grpc-port 0`: the
        # port the server chooses (test_grpc_port_zero_is_chosen_once_and_announced); the sigterm test's servers
        # are given theirs.
        flags = ("--workers", "2", "--api-key", KEY, "--max-body-bytes", "65536", "--read-timeout-s", str(IDLE_S))
        return GrpcServer(arch, *flags, grpc_port=0)

    with servers_per_arch(ARCHS, make) as started:
        yield started  # type: ignore[misc]


@pytest.fixture(params=ARCHS)
def server(request: pytest.FixtureRequest, grpc_servers: dict[str, GrpcServer]) -> GrpcServer:
    return grpc_servers[request.param]


@pytest.fixture
def client(server: GrpcServer) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.target) as grpc_client:
        yield grpc_client


@pytest.fixture
def stub(server: GrpcServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def every_type() -> dict[str, np.ndarray[Any, Any]]:
    """Two rows of two elements in each datatype, with each type's extremes where it has them."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for name, dtype in DATATYPES.items():
        if name == "BYTES":
            arrays[name] = np.array([["a", "b"], ["", "déjà vu"]], dtype=object)
        elif name == "BOOL":
            arrays[name] = np.array([[True, False], [False, True]])
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            arrays[name] = np.array([[info.min, 0], [1, info.max]], dtype=dtype)
        else:
            arrays[name] = np.array([[0.5, -1.25], [3.0, 1e4]], dtype=dtype)
    return arrays


def triton_inputs(arrays: dict[str, np.ndarray[Any, Any]]) -> list[triton.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(f"in_{name}", list(array.shape), name)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def affine_inputs(rows: list[list[float]], scales: list[float]) -> list[triton.InferInput]:
    x = triton.InferInput("x", [len(rows), 2], "FP64")
    x.set_data_from_numpy(np.array(rows, dtype=np.float64))
    scale = triton.InferInput("scale", [len(scales)], "FP64")
    scale.set_data_from_numpy(np.array(scales, dtype=np.float64))
    return [x, scale]


def expect_error(code: grpc.StatusCode, fragment: str, call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    assert caught.value.status() == str(code), caught.value
    message = str(caught.value.message())
    assert fragment in message, message
    return message


# -- health, metadata, the Triton shims ---------------------------------------------------------------------------
def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()  # probes need no key, as over HTTP
    assert client.is_model_ready("affine", headers=AUTH)  # a model's readiness needs one, as over HTTP
    metadata = client.get_server_metadata(headers=AUTH)
    assert metadata.name == "twinserve" and "binary_tensor_data" in metadata.extensions
    model = client.get_model_metadata("affine", headers=AUTH, as_json=True)
    assert model["name"] == "affine" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("x", "FP64", ["-1", "2"]),
        ("scale", "FP64", ["-1"]),
    ]


def test_metadata_and_config_match_rest(server: GrpcServer, client: triton.InferenceServerClient) -> None:
    rest = HTTP.get(f"{server.url}/v2/models/everytype/config", headers=AUTH, timeout=30).json()
    config = client.get_model_config("everytype", headers=AUTH, as_json=True)["config"]
    assert config["name"] == rest["name"] and int(config["max_batch_size"]) == rest["max_batch_size"]
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [
        (t["name"], t["data_type"]) for t in rest["input"]
    ]
    stats = client.get_inference_statistics("affine", headers=AUTH, as_json=True)["model_stats"]
    assert [s["name"] for s in stats] == ["affine"]
    every = client.get_inference_statistics(headers=AUTH, as_json=True)["model_stats"]
    assert {s["name"] for s in every} == {"everytype", "everytypedtype", "affine", "tokens", "slow", "faulty"}


# -- inference ----------------------------------------------------------------------------------------------------
def test_every_datatype_round_trips_raw(client: triton.InferenceServerClient) -> None:
    arrays = every_type()
    result = client.infer("everytype", triton_inputs(arrays), headers=AUTH)
    for name, array in arrays.items():
        got = result.as_numpy(f"out_{name}")
        assert got is not None and got.shape == array.shape, name
        if name == "BYTES":
            assert [[b.decode() for b in row] for row in got.tolist()] == array.tolist()
        else:
            assert got.dtype == array.dtype and np.array_equal(got, array), name


_TYPED_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
METADATA = tuple(AUTH.items())


def typed_request(arrays: dict[str, np.ndarray[Any, Any]]) -> service_pb2.ModelInferRequest:
    """A request whose inputs carry typed `contents`, and whose outputs are asked for by name."""
    request = service_pb2.ModelInferRequest(model_name="everytypedtype", id="typed-1")
    for name, array in arrays.items():
        tensor = request.inputs.add(name=f"in_{name}", datatype=name, shape=list(array.shape))
        flat = array.reshape(-1).tolist()
        getattr(tensor.contents, _TYPED_FIELDS[name]).extend([v.encode() for v in flat] if name == "BYTES" else flat)
        request.outputs.add(name=f"out_{name}")
    return request


def test_every_typed_datatype_round_trips(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    arrays = {name: array for name, array in every_type().items() if name in TYPED}
    response, call = stub.ModelInfer.with_call(typed_request(arrays), metadata=METADATA)
    assert response.id == "typed-1" and response.model_name == "everytypedtype"
    assert dict(call.trailing_metadata())["x-request-id"]
    outputs = dict(zip([o.name for o in response.outputs], response.raw_output_contents, strict=True))
    for name, array in arrays.items():
        data = outputs[f"out_{name}"]
        if name == "BYTES":
            assert data == b"".join(len(v.encode()).to_bytes(4, "little") + v.encode() for v in array.reshape(-1))
        else:
            assert np.array_equal(np.frombuffer(data, dtype=array.dtype.newbyteorder("<")).reshape(2, 2), array)


def test_typed_and_raw_contents_do_not_mix(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = typed_request({"BOOL": np.array([[True, False]])})
    request.raw_input_contents.append(b"\x01\x00")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, metadata=METADATA)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "both contents and raw_input_contents" in str(caught.value.details())


def test_the_same_predictions_as_rest(server: GrpcServer, client: triton.InferenceServerClient) -> None:
    rows, scales = [[1.0, 2.0], [3.5, -1.0]], [2.0, 0.5]
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP64", "shape": [2, 2], "data": rows},
            {"name": "scale", "datatype": "FP64", "shape": [2], "data": scales},
        ]
    }
    rest = HTTP.post(f"{server.url}/v2/models/affine/infer", json=body, headers=AUTH, timeout=30).json()
    result = client.infer("affine", affine_inputs(rows, scales), headers=AUTH)
    by_name = {o["name"]: o["data"] for o in rest["outputs"]}
    assert result.as_numpy("y").reshape(-1).tolist() == by_name["y"]
    assert result.as_numpy("total").tolist() == by_name["total"]
    assert result.get_response().model_version == rest["model_version"]


# -- errors -------------------------------------------------------------------------------------------------------
def test_errors_map_to_grpc_codes(client: triton.InferenceServerClient) -> None:
    good = affine_inputs([[1.0, 2.0]], [1.0])
    expect_error(grpc.StatusCode.UNAUTHENTICATED, "API key", client.infer, "affine", good)
    wrong = {"x-api-key": "not-the-key-0123456789"}
    expect_error(grpc.StatusCode.UNAUTHENTICATED, "API key", client.get_model_metadata, "affine", headers=wrong)
    expect_error(grpc.StatusCode.NOT_FOUND, "'nope'", client.infer, "nope", good, headers=AUTH)
    expect_error(grpc.StatusCode.NOT_FOUND, "no version '9'", client.infer, "affine", good, "9", headers=AUTH)
    expect_error(grpc.StatusCode.NOT_FOUND, "'nope'", client.get_model_metadata, "nope", headers=AUTH)
    bad_shape = affine_inputs([[1.0, 2.0]], [1.0, 2.0])
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "disagree", client.infer, "affine", bad_shape, headers=AUTH)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown input",
        client.infer,
        "affine",
        [*good[:1], _renamed(good[1], "nope")],
        headers=AUTH,
    )
    boom = triton.InferInput("input", [1], "BYTES")
    boom.set_data_from_numpy(np.array(["boom"], dtype=object))
    expect_error(grpc.StatusCode.INTERNAL, "", client.infer, "faulty", [boom], headers=AUTH)
    expect_error(grpc.StatusCode.UNAUTHENTICATED, "API key", client.is_model_ready, "affine")


def _renamed(tensor: triton.InferInput, name: str) -> triton.InferInput:
    renamed = triton.InferInput(name, tensor.shape(), tensor.datatype())
    renamed.set_data_from_numpy(np.array([1.0]))
    return renamed


def test_a_message_past_the_size_limit_is_refused(client: triton.InferenceServerClient) -> None:
    rows = [[1.0, 2.0]] * 8192  # 128 KiB of x, past --max-body-bytes 65536
    inputs = affine_inputs(rows, [1.0] * len(rows))
    expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "", client.infer, "affine", inputs, headers=AUTH)
    assert client.is_server_live()


def test_deadlines(server: GrpcServer, client: triton.InferenceServerClient) -> None:
    x = triton.InferInput("input", [1], "BYTES")
    x.set_data_from_numpy(np.array(['"a"'], dtype=object))
    # The deadline header, as over HTTP: the server answers 504, gRPC's DEADLINE_EXCEEDED, with its message.
    headers = {**AUTH, "x-request-timeout-ms": "100"}
    expect_error(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline", client.infer, "slow", [x], headers=headers)
    # The gRPC deadline becomes the request's: the call ends at it, the model's slow answer is not awaited.
    expect_error(grpc.StatusCode.DEADLINE_EXCEEDED, "", client.infer, "slow", [x], headers=AUTH, client_timeout=0.1)
    assert client.infer("slow", [x], headers=AUTH, client_timeout=30).as_numpy("output") is not None


def test_calls_count_and_log_like_http(server: GrpcServer, client: triton.InferenceServerClient) -> None:
    before = sample(scrape(server), "twinserve_requests_total", model="affine", endpoint="infer", code="200")
    client.infer("affine", affine_inputs([[1.0, 2.0]], [1.0]), headers={**AUTH, "x-request-id": "grpc-req-42"})
    after = sample(scrape(server), "twinserve_requests_total", model="affine", endpoint="infer", code="200")
    assert after == before + 1
    assert "grpc-req-42" in server.output()


def test_stream_infer_answers_each_request(client: triton.InferenceServerClient) -> None:
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        if len(answers) == 3:
            done.set()

    client.start_stream(callback, headers=AUTH)
    try:
        client.async_stream_infer("affine", affine_inputs([[1.0, 2.0]], [2.0]), request_id="s1")
        client.async_stream_infer("nope", affine_inputs([[1.0, 2.0]], [2.0]), request_id="s2")
        client.async_stream_infer("affine", affine_inputs([[3.0, 4.0]], [1.0]), request_id="s3")
        assert done.wait(30)
    finally:
        client.stop_stream()
    (first, e1), (second, e2), (third, e3) = answers
    assert e1 is None and first.as_numpy("y").tolist() == [[2.0, 4.0]] and first.get_response().id == "s1"
    assert first is not None and second is None and "'nope'" in str(e2)
    assert e3 is None and third.as_numpy("total").tolist() == [7.0]


def test_stream_infer_streams_a_streaming_model(server: GrpcServer, client: triton.InferenceServerClient) -> None:
    prompt = triton.InferInput("input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array(['{"text": "Why stream?", "max_tokens": 4}'], dtype=object))
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        if len(answers) == 4 or error is not None:
            done.set()

    client.start_stream(callback, headers=AUTH)
    try:
        client.async_stream_infer("tokens", [prompt], request_id="t1")
        assert done.wait(30)
    finally:
        client.stop_stream()
    assert [error for _, error in answers] == [None] * 4, [str(e) for _, e in answers]
    words = [result.as_numpy("output").tolist()[0][0] for result, _ in answers]  # shape [1, 1]: one chunk
    rest = HTTP.post(
        f"{server.url}/v1/models/tokens:stream",
        json={"instances": [{"text": "Why stream?", "max_tokens": 4}]},
        headers=AUTH,
        timeout=30,
    )
    steps = [line for line in rest.text.splitlines() if line.startswith('data: {"predictions"')]
    assert steps == [f'data: {{"predictions":["{word.decode()}"]}}' for word in words]  # the same words as :stream


@pytest.mark.parametrize("arch", ARCHS)
def test_calls_past_the_queue_bound_are_unavailable(arch: str, tmp_path: Path) -> None:
    """With the model busy and its queue full, the next calls are refused at once with UNAVAILABLE (503), the
    ones admitted are answered once the model is free."""
    gate = tmp_path / "gate"
    flags = ("--workers", "1", "--threads", "1", "--max-queue", "1", "--max-batch-size", "1")
    with Server([model_path("Gate")], arch, "--grpc-port", "0", *flags) as server:
        target = announced_grpc(server.output())
        assert target is not None
        held = triton.InferInput("input", [1], "BYTES")
        held.set_data_from_numpy(np.array([f'{{"gate": "{gate}"}}'], dtype=object))
        answers: list[tuple[Any, Any]] = []
        everyone = threading.Semaphore(0)

        def callback(result: Any, error: Any) -> None:
            answers.append((result, error))
            everyone.release()

        with triton.InferenceServerClient(target) as grpc_client:
            grpc_client.async_infer("gate", [held], callback)
            wait_for_file(gate.with_suffix(".started"))
            for _ in range(4):
                grpc_client.async_infer("gate", [held], callback)
            deadline = time.monotonic() + 30
            while not any(error is not None for _, error in answers):  # a refusal needs no free model
                assert time.monotonic() < deadline, answers
                time.sleep(0.01)
            gate.with_suffix(".release").touch()
            for _ in range(5):
                assert everyone.acquire(timeout=60)
    errors = [error for _, error in answers if error is not None]
    assert errors and all(e.status() == "StatusCode.UNAVAILABLE" for e in errors), [str(e) for e in errors]
    assert sum(result is not None for result, _ in answers) >= 2  # the held call and one queued behind it


@pytest.mark.parametrize("arch", ARCHS)
def test_sigterm_drains_grpc_calls(arch: str) -> None:
    """A call in flight when SIGTERM arrives is answered; the server then exits cleanly."""
    server = GrpcServer(arch, "--workers", "1").start()
    try:
        with triton.InferenceServerClient(server.target) as grpc_client:
            x = triton.InferInput("input", [1], "BYTES")
            x.set_data_from_numpy(np.array(['"a"'], dtype=object))
            answers: list[Any] = []
            grpc_client.async_infer("slow", [x], lambda result, error: answers.append((result, error)))
            _wait_until_requested(server)
            server.terminate()
            assert server.process is not None and server.process.wait(30) == 0
            result, error = answers[0]
            assert error is None and result.as_numpy("output").tolist() == [b'"a"']
    finally:
        server.stop()


def _wait_until_requested(server: GrpcServer) -> None:
    deadline = time.monotonic() + 30
    while sample(scrape(server), "twinserve_in_flight_requests") < 1:  # a scrape is not counted
        assert time.monotonic() < deadline, "the call never arrived"
        time.sleep(0.02)


def test_grpc_port_zero_is_chosen_once_and_announced(server: GrpcServer) -> None:
    """`--grpc-port 0`: one free port for every worker process, said in the start-up line (the module's servers:
    `--workers 2`, `--grpc-port 0`)."""
    assert "--grpc-port 0 --workers 2 " in " ".join(server.args)  # what this test is about, whatever else it serves
    target = announced_grpc(server.output())
    assert target is not None and not target.endswith(":0"), server.output()
    with triton.InferenceServerClient(target) as grpc_client:
        for _ in range(4):
            result = grpc_client.infer("affine", affine_inputs([[1.0, 2.0]], [2.0]), headers=AUTH)
            assert result.as_numpy("total").tolist() == [6.0]


def test_the_checked_in_stubs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(Path(ROOT, "scripts", "gen_grpc.py")), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


GARBAGE = b"\xff\xff\xff\xff"  # wire type 7: no protobuf message parses it


def test_a_malformed_message_is_invalid_argument_and_logged_in_aggregate(server: GrpcServer) -> None:
    # Before (issue #44): INTERNAL, and grpcio's traceback in the log for every message, before authentication.
    logged_before = len(server.output())
    with grpc.insecure_channel(server.target) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(200):
            with pytest.raises(grpc.RpcError) as caught:
                infer(GARBAGE, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            assert "not a valid ModelInfer message" in (caught.value.details() or "")
        streamed = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as caught:
            list(streamed(iter([GARBAGE]), metadata=tuple(AUTH.items()), timeout=30))  # a keyless one is refused
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
        live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest())
        assert live.live
    output = server.output()[logged_before:]
    assert "Traceback" not in output and "deserializing" not in output
    assert 1 <= output.count("malformed gRPC message(s)") <= 2 * 3  # a line per interval, per worker process


def test_a_stream_is_not_held_for_free(server: GrpcServer) -> None:
    # Before (issue #44): 300 keyless streams that never sent a message were held open as long as their clients liked.
    with grpc.insecure_channel(server.target) as channel:
        streamed = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        keyless = streamed(iter(()), timeout=60)  # refused before any message is read
        with pytest.raises(grpc.RpcError) as caught:
            list(keyless)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value
        silent = threading.Event()

        def nothing() -> Iterator[bytes]:
            silent.wait(120)  # sends no message until the test ends
            yield from ()

        try:
            with pytest.raises(grpc.RpcError) as caught:
                list(streamed(nothing(), metadata=tuple(AUTH.items()), timeout=IDLE_S + 60))
        finally:
            silent.set()
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, caught.value
        assert f"no message on this stream for {IDLE_S} s" in (caught.value.details() or "")
