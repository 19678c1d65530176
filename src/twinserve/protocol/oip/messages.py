"""Open Inference Protocol messages over gRPC <-> the V2 codec's bytes. Transport-free.

A `ModelInferRequest` becomes what the V2 codec reads over HTTP with Triton's binary extension (`infer_message`),
with typed `contents` packed to the same little-endian layout by one numpy call per tensor, so gRPC, REST JSON and
REST binary requests are checked and decoded by one codec, with the same messages and statuses. Outputs are
always answered as binary data in `raw_output_contents`, as Triton's gRPC server does (`response_message`);
`infer_body` and `infer_response` are the twins over the REST bodies.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from twinserve.errors import InvalidTensor
from twinserve.protocol.oip import grpc_service_pb2 as pb
from twinserve.protocol.tensors import NUMPY_DTYPES
from twinserve.protocol.v1 import dumps

__all__ = [
    "config_message",
    "infer_body",
    "infer_message",
    "infer_response",
    "metadata_message",
    "parameters_dict",
    "response_message",
    "statistics_message",
]

#: The typed-contents field of each datatype (FP16 has none: it travels raw only, as in Triton).
CONTENTS_FIELD = {
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
_LENGTH = struct.Struct("<I")
_FIELD_DTYPES = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


def parameters_dict(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A protobuf parameter map as the V2 JSON `parameters` object."""
    out: dict[str, Any] = {}
    for name, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        out[name] = None if choice is None else getattr(parameter, choice)
    return out


def _packed(tensor: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """Typed contents as binary tensor data (little-endian; BYTES length-prefixed)."""
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidTensor(f"input {tensor.name!r}: {tensor.datatype} data must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    if tensor.datatype == "BYTES":
        return b"".join(_LENGTH.pack(len(v)) + v for v in values)
    dtype = NUMPY_DTYPES[tensor.datatype]
    # In the field's own type first (int_contents holds INT8 as int32, which protobuf has checked), then
    # range-checked for the datatype before the cast, which would wrap silently.
    array: np.ndarray[Any, Any] = np.asarray(values, dtype=_FIELD_DTYPES[field])
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidTensor(f"input {tensor.name!r}: a value is out of the range of {tensor.datatype}")
    return array.astype(dtype.newbyteorder("<"), copy=False).tobytes()


def _contents_given(tensor: pb.ModelInferRequest.InferInputTensor) -> bool:
    return bool(tensor.HasField("contents"))


def infer_body(request: pb.ModelInferRequest) -> tuple[bytes, int]:
    """The V2 body (JSON header, then binary tensor data) for `request`, and the header's length: the REST twin
    of `infer_message`, byte for byte what a V2 client would send over HTTP."""
    header, data = infer_message(request)
    head = dumps(header)
    return head + data, len(head)


def infer_message(request: pb.ModelInferRequest) -> tuple[dict[str, Any], bytes]:
    """The V2 request for `request` as the V2 codec reads it, with no JSON between (`V2Codec.decode_message`):
    the header's object, every input's data sent as binary data (`binary_data_size`), and that data."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidTensor(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    if raw and any(_contents_given(t) for t in request.inputs):
        raise InvalidTensor("an input has both contents and raw_input_contents: send one or the other")
    inputs, buffers = [], []
    for index, tensor in enumerate(request.inputs):
        data = raw[index] if raw else _packed(tensor)
        parameters = parameters_dict(tensor.parameters) | {"binary_data_size": len(data)}
        inputs.append(
            {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape), "parameters": parameters}
        )
        buffers.append(data)
    header: dict[str, Any] = {"inputs": inputs, "parameters": parameters_dict(request.parameters)}
    if request.id:
        header["id"] = request.id
    if request.outputs:
        header["outputs"] = [
            {"name": o.name, "parameters": parameters_dict(o.parameters) | {"binary_data": True}}
            for o in request.outputs
        ]
    else:
        header["parameters"]["binary_data_output"] = True
    return header, b"".join(buffers)


def infer_response(body: bytes, header_length: int | None) -> pb.ModelInferResponse:
    """The V2 codec's reply bytes (header, then each output's binary data) as a `ModelInferResponse`: the REST
    twin of `response_message`."""
    length = len(body) if header_length is None else header_length
    header = orjson.loads(body[:length])
    buffers, offset = [], length
    for output in header["outputs"]:
        size = output["parameters"]["binary_data_size"]
        buffers.append(body[offset : offset + size])
        offset += size
    return response_message(header, buffers)


def response_message(header: Mapping[str, Any], buffers: list[bytes]) -> pb.ModelInferResponse:
    """The V2 codec's reply as the codec gives it (`V2Codec.encode_message`: the header's object and each
    output's binary data, every output asked for as binary by `infer_message`) as a `ModelInferResponse`."""
    response = pb.ModelInferResponse(
        model_name=header["model_name"], model_version=header["model_version"], id=header.get("id", "")
    )
    for output in header["outputs"]:
        response.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
    response.raw_output_contents.extend(buffers)
    return response


def metadata_message(metadata: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    """The V2 model metadata (`V2Codec.metadata`) as its protobuf message."""
    return pb.ModelMetadataResponse(
        name=metadata["name"],
        versions=metadata["versions"],
        platform=metadata["platform"],
        inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in metadata["inputs"]],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in metadata["outputs"]],
    )


def config_message(config: Mapping[str, Any]) -> pb.ModelConfig:
    """Triton's model configuration subset (`V2Codec.config`) as its protobuf message."""

    def tensor(kind: type[pb.ModelInput] | type[pb.ModelOutput], t: Mapping[str, Any]) -> Any:
        reshape = pb.ModelTensorReshape(shape=t["reshape"]["shape"]) if "reshape" in t else None
        return kind(name=t["name"], data_type=pb.DataType.Value(t["data_type"]), dims=t["dims"], reshape=reshape)

    message = pb.ModelConfig(
        name=config["name"],
        platform=config["platform"],
        backend=config["backend"],
        max_batch_size=config["max_batch_size"],
        input=[tensor(pb.ModelInput, t) for t in config["input"]],
        output=[tensor(pb.ModelOutput, t) for t in config["output"]],
    )
    batching = config.get("dynamic_batching")
    if batching is not None:
        message.dynamic_batching.max_queue_delay_microseconds = batching["max_queue_delay_microseconds"]
    return message


def statistics_message(stats: list[Mapping[str, Any]]) -> pb.ModelStatisticsResponse:
    """Triton's statistics extension (`v2.statistics` entries) as its protobuf message."""
    response = pb.ModelStatisticsResponse()
    for entry in stats:
        model = response.model_stats.add(
            name=entry["name"],
            version=entry["version"],
            inference_count=entry["inference_count"],
            execution_count=entry["execution_count"],
        )
        for name, duration in entry["inference_stats"].items():
            getattr(model.inference_stats, name).CopyFrom(pb.StatisticDuration(**duration))
    return response
