"""WebSocket stream messages without a server: ids read back, errors as HTTP's, the binary framing."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from twinserve.errors import InvalidTensor, MalformedRequest, OutputMismatch
from twinserve.examples.tabular import Classifier, IrisFeatures
from twinserve.model import ModelSpec
from twinserve.protocol.v1 import V1Codec
from twinserve.protocol.v2 import V2Codec
from twinserve.protocol.websocket import FRAME_PREFIX, MessageError, WebSocketCodec

SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}


@pytest.fixture(scope="module")
def codec() -> WebSocketCodec:
    spec = ModelSpec(Classifier())
    return WebSocketCodec(spec.input_type, V1Codec(spec.name, spec.input_type, spec.output_type), V2Codec(spec))


def frame(header: dict[str, object], tensors: bytes = b"") -> bytes:
    encoded = orjson.dumps(header)
    return struct.pack(">I", len(encoded)) + encoded + tensors


def test_a_text_message_gives_its_id_and_validated_instances(codec: WebSocketCodec) -> None:
    message = codec.decode_text(orjson.dumps({"id": "a1", "instances": [SETOSA], "extra": 1}).decode())
    assert message.id == "a1" and message.instances == [IrisFeatures(**SETOSA)]
    assert codec.decode_text(orjson.dumps({"instances": [SETOSA]}).decode()).id is None
    assert orjson.loads(codec.encode_text("a1", ["x"], 1)) == {"id": "a1", "predictions": ["x"]}
    with pytest.raises(OutputMismatch):
        codec.encode_text("a1", ["x", "y"], 1)


@pytest.mark.parametrize(
    ("text", "message_id", "code", "message"),
    [
        ('{"id": "a", "instances": [', None, "malformed_json", "request body is not valid JSON"),
        ('["a"]', None, "validation_failed", "request body must be a JSON object with an 'instances' list"),
        ('{"id": "b"}', "b", "validation_failed", "instances: Field required"),
        ('{"id": "c", "instances": []}', "c", "validation_failed", "instances: List should have at least 1 item"),
        ('{"id": "d", "instances": [[1, 2, 3, 4]]}', "d", "validation_failed", "instances[0]: Input should be"),
        ('{"id": 7, "instances": [{}]}', None, "validation_failed", "instances[0].sepal_length: Field required"),
    ],
)
def test_a_refused_text_message_keeps_the_id_it_could_read(
    codec: WebSocketCodec, text: str, message_id: str | None, code: str, message: str
) -> None:
    with pytest.raises(MessageError) as refused:
        codec.decode_text(text)
    assert refused.value.id == message_id
    assert refused.value.error.code == code and refused.value.error.message.startswith(message)


def test_a_binary_message_is_a_framed_v2_request_and_is_answered_in_the_same_framing(codec: WebSocketCodec) -> None:
    rows = np.array([list(SETOSA.values())], dtype=np.float32)
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": rows.nbytes}}
    message = codec.decode_binary(frame({"id": "t", "inputs": [tensor]}, rows.tobytes()))
    (instance,) = message.request.instances
    assert message.id == "t" and instance.model_dump() == pytest.approx(SETOSA)  # FP32 on the wire
    output = {"label": "setosa", "class_id": 0, "probabilities": [1.0, 0.0, 0.0]}
    answer = codec.encode_binary(message.request, [output])
    (length,) = struct.unpack(">I", answer[:FRAME_PREFIX])
    assert length == len(answer) - FRAME_PREFIX  # JSON outputs: no tensor bytes follow
    assert orjson.loads(answer[FRAME_PREFIX:])["outputs"][0] == {
        "name": "label", "datatype": "BYTES", "shape": [1], "data": ["setosa"]
    }  # fmt: skip


@pytest.mark.parametrize(
    ("data", "message_id", "error"),
    [
        (b"\x00\x00", None, MalformedRequest),
        (b"\x00\x00\x00\x09{}", None, MalformedRequest),
        (frame({"id": "t", "inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 4]}]}), "t", InvalidTensor),
        (frame({"id": "u", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}, b"x"),
         "u", InvalidTensor),
    ],
)  # fmt: skip
def test_a_refused_binary_message_keeps_the_id_it_could_read(
    codec: WebSocketCodec, data: bytes, message_id: str | None, error: type[Exception]
) -> None:
    with pytest.raises(MessageError) as refused:
        codec.decode_binary(data)
    assert refused.value.id == message_id and isinstance(refused.value.error, error)
    assert WebSocketCodec.message_id(data) == message_id
    header = orjson.loads(codec.binary_error(message_id, refused.value.error, "r1")[FRAME_PREFIX:])
    expected = {"code": refused.value.error.code, "message": refused.value.error.message, "request_id": "r1"}
    assert header == {"id": message_id, "error": expected}
