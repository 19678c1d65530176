"""The gRPC messages <-> V2 body translation (protocol/oip/messages.py) and the status mapping, in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc  # noqa: F401  # registers the same `inference.*` names in protobuf's global pool

from twinserve.errors import InvalidTensor, TwinserveError
from twinserve.fronts.grpc import GRPC_CODES, grpc_code
from twinserve.model import ModelSpec
from twinserve.protocol.oip import grpc_service_pb2 as pb
from twinserve.protocol.oip.messages import (
    config_message,
    infer_body,
    infer_message,
    infer_response,
    parameters_dict,
    response_message,
    statistics_message,
)
from twinserve.protocol.v2 import InferenceRequest, V2Codec

ROOT = Path(__file__).resolve().parents[3]


def _split(body: bytes, length: int) -> tuple[dict[str, Any], bytes]:
    return orjson.loads(body[:length]), body[length:]


def test_raw_contents_become_binary_data_as_sent() -> None:
    request = pb.ModelInferRequest(model_name="m", id="r1")
    request.inputs.add(name="a", datatype="FP32", shape=[1, 2])
    request.inputs.add(name="b", datatype="BYTES", shape=[1])
    request.raw_input_contents.extend([np.array([1.5, 2.5], "<f4").tobytes(), b"\x02\x00\x00\x00hi"])
    request.parameters["timeout"].int64_param = 5000
    header, binary = _split(*infer_body(request))
    assert header["id"] == "r1" and header["parameters"] == {"timeout": 5000, "binary_data_output": True}
    assert [(i["name"], i["parameters"]["binary_data_size"]) for i in header["inputs"]] == [("a", 8), ("b", 6)]
    assert binary == b"".join(request.raw_input_contents)


def test_typed_contents_are_packed_little_endian() -> None:
    request = pb.ModelInferRequest(model_name="m")
    ints = request.inputs.add(name="i", datatype="INT16", shape=[3])
    ints.contents.int_contents.extend([-1, 0, 300])
    words = request.inputs.add(name="w", datatype="BYTES", shape=[2])
    words.contents.bytes_contents.extend([b"a", "é".encode()])
    request.outputs.add(name="o").parameters["binary_data"].bool_param = False
    header, binary = _split(*infer_body(request))
    assert binary[:6] == np.array([-1, 0, 300], "<i2").tobytes()
    assert binary[6:] == b"\x01\x00\x00\x00a\x02\x00\x00\x00" + "é".encode()
    assert header["outputs"] == [{"name": "o", "parameters": {"binary_data": True}}]  # always answered raw


@pytest.mark.parametrize(
    ("datatype", "field", "values", "message"),
    [
        ("INT8", "int_contents", [300], "out of the range of INT8"),
        ("FP16", "fp32_contents", [1.0], "FP16 data must be sent in raw_input_contents"),
    ],
)
def test_typed_contents_that_cannot_be_packed(datatype: str, field: str, values: list[Any], message: str) -> None:
    request = pb.ModelInferRequest(model_name="m")
    getattr(request.inputs.add(name="x", datatype=datatype, shape=[1]).contents, field).extend(values)
    with pytest.raises(InvalidTensor, match=message):
        infer_body(request)


def test_raw_contents_must_match_the_inputs() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="a", datatype="FP32", shape=[1])
    request.inputs.add(name="b", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(InvalidTensor, match="1 raw_input_contents for 2 inputs"):
        infer_body(request)


def test_parameters_of_every_kind() -> None:
    request = pb.ModelInferRequest()
    request.parameters["b"].bool_param = True
    request.parameters["i"].int64_param = -3
    request.parameters["s"].string_param = "x"
    request.parameters["d"].double_param = 0.5
    request.parameters["u"].uint64_param = 2**63
    request.parameters["none"].CopyFrom(pb.InferParameter())
    assert parameters_dict(request.parameters) == {"b": True, "i": -3, "s": "x", "d": 0.5, "u": 2**63, "none": None}


def test_the_codec_reply_becomes_raw_output_contents() -> None:
    from tests.models import Affine

    codec = V2Codec(ModelSpec(Affine()))
    request = pb.ModelInferRequest(model_name="affine")
    request.inputs.add(name="x", datatype="FP64", shape=[1, 2])
    request.inputs.add(name="scale", datatype="FP64", shape=[1])
    request.raw_input_contents.extend([np.array([1.0, 2.0]).tobytes(), np.array([3.0]).tobytes()])
    body, length = infer_body(request)
    decoded: InferenceRequest = codec.decode(body, str(length))
    reply, header_length = codec.encode(decoded, [{"y": [3.0, 6.0]}])
    response = infer_response(reply, header_length)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("y", "FP64", [1, 2]),
        ("total", "FP64", [1]),
    ]
    assert np.frombuffer(response.raw_output_contents[1], "<f8").tolist() == [9.0]
    config = config_message(codec.config(8, 2.0))
    assert config.max_batch_size == 8 and config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert config.input[1].reshape.shape == [] and config.input[0].data_type == pb.DataType.Value("TYPE_FP64")


def test_a_message_decodes_as_its_rest_body_does_without_json_between() -> None:
    """gRPC's path (`infer_message` -> `V2Codec.decode_message`) and REST's (`infer_body` -> `V2Codec.decode`)
    give the same request, and refuse the same tensors with the same message."""
    from tests.models import Affine

    codec = V2Codec(ModelSpec(Affine()))
    request = pb.ModelInferRequest(model_name="affine", id="r7")
    request.inputs.add(name="x", datatype="FP64", shape=[2, 2])
    request.inputs.add(name="scale", datatype="FP64", shape=[2])
    request.raw_input_contents.extend([np.array([1.0, 2.0, 3.0, 4.0]).tobytes(), np.array([3.0, 0.5]).tobytes()])
    request.parameters["timeout"].int64_param = 5000
    message, data = infer_message(request)
    body, length = infer_body(request)
    assert body == orjson.dumps(message) + data and length == len(orjson.dumps(message))
    direct, rest = codec.decode_message(message, memoryview(data)), codec.decode(body, str(length))
    assert (direct.id, direct.timeout_us) == (rest.id, rest.timeout_us) == ("r7", 5000)
    assert direct.outputs == rest.outputs
    assert repr(direct.instances) == repr(rest.instances) and len(direct.instances) == 2
    outputs = [{"y": [3.0, 6.0]}, {"y": [1.5, 2.0]}]
    answered = response_message(*codec.encode_message(direct, outputs))
    assert answered == infer_response(*codec.encode(rest, outputs))  # the reply too: no JSON between, same message
    assert answered.id == "r7" and [o.name for o in answered.outputs] == ["y", "total"]
    request.inputs[1].shape[:] = [3]  # a shape its data does not fill
    message, data = infer_message(request)
    body, length = infer_body(request)
    with pytest.raises(InvalidTensor) as direct_error:
        codec.decode_message(message, memoryview(data))
    with pytest.raises(InvalidTensor) as rest_error:
        codec.decode(body, str(length))
    assert direct_error.value.message == rest_error.value.message


def test_statistics_message() -> None:
    duration = {"count": 2, "ns": 10}
    entry = {
        "name": "m",
        "version": "1",
        "inference_count": 3,
        "execution_count": 1,
        "inference_stats": {"queue": duration},
    }
    (model,) = statistics_message([entry]).model_stats
    assert model.inference_count == 3 and model.inference_stats.queue.ns == 10


def _descendants(cls: type[TwinserveError]) -> list[type[TwinserveError]]:
    return [cls, *(d for sub in cls.__subclasses__() for d in _descendants(sub))]


def test_every_error_status_has_its_grpc_code_documented() -> None:
    statuses = {error.status for error in _descendants(TwinserveError)}
    http_only = {405, 414, 426, 431}  # the HTTP parser's own refusals: a gRPC call has no method, URI or headers
    assert statuses - set(GRPC_CODES) - http_only <= {500}  # a plain 500 is INTERNAL, like any other 5xx
    assert grpc_code(500) == grpc.StatusCode.INTERNAL and grpc_code(418) == grpc.StatusCode.INVALID_ARGUMENT
    page = (ROOT / "docs" / "grpc.md").read_text()
    for status, code in GRPC_CODES.items():
        row = next(
            (line for line in page.splitlines() if line.startswith("|") and str(status) in line.split("|")[1]), ""
        )
        assert f"`{code.name}`" in row, (status, code)
