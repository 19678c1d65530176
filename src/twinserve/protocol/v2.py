"""The Open Inference Protocol (KServe V2) codec, with Triton's binary tensor data extension. Transport-free.

A request's named tensors are checked against the model's (unknown name, shape or datatype: 400), decoded to numpy
in one vectorised call, and their rows become the instances `ModelRuntime.predict` gets, as a V1 request's would;
outputs go back the same way. With the binary extension (tritonclient's default) the JSON header is followed by
raw tensor bytes, `Inference-Header-Content-Length` saying where it ends. Errors have the V2 body `{"error": ...}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from pydantic import TypeAdapter, ValidationError

from twinserve.errors import (
    InvalidTensor,
    MalformedRequest,
    ModelFailed,
    OutputMismatch,
    TooManyElements,
    TooManyInstances,
    TwinserveError,
    ValidationFailed,
)
from twinserve.model import ModelSpec, Tensor
from twinserve.observability.context import request_id as current_request_id
from twinserve.observability.metrics import InferenceTotals
from twinserve.protocol.tensors import (
    array_from_bytes,
    array_from_json,
    array_to_bytes,
    array_to_json,
    bind,
)
from twinserve.protocol.v1 import dumps

if TYPE_CHECKING:
    from twinserve.config import Config

__all__ = [
    "BINARY",
    "HEADER_LENGTH",
    "PLATFORM",
    "InferenceRequest",
    "RequestedOutput",
    "V2Codec",
    "error_body",
    "server_metadata",
    "statistics",
]

#: Request and response header: the length of the JSON part of a body that binary tensor data follows.
HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY = "application/octet-stream"
PLATFORM = "twinserve"
#: The V2 extensions served here (Triton's names).
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
#: Triton's model-configuration names for the V2 datatypes.
_CONFIG_TYPES = {"BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING"} | {
    name: f"TYPE_{name}"
    for name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32", "FP64")
}
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "classification")


def error_body(error: TwinserveError) -> bytes:
    """The V2 error body: `{"error": "message"}`."""
    return dumps({"error": error.message})


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": PLATFORM, "version": version, "extensions": list(EXTENSIONS)}


@dataclass(frozen=True)
class RequestedOutput:
    tensor: Tensor
    binary: bool


@dataclass(frozen=True)
class InferenceRequest:
    """A decoded V2 inference request: the instances for the runtime and how to answer."""

    instances: list[Any]
    id: str | None
    outputs: tuple[RequestedOutput, ...]
    #: Triton's `parameters.timeout`, in microseconds.
    timeout_us: int | None = None
    #: Triton's `parameters.priority`, as sent (admission checks it against `--priority-levels`).
    priority: Any = None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidTensor(f"{what} must be a JSON object")
    return value


def _parameters(item: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = item.get("parameters")
    return {} if parameters is None else _object(parameters, f"{what} parameters")


def _shape(value: Any, tensor: Tensor) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise InvalidTensor(f"input {tensor.name!r}: shape must be a list of non-negative integers, got {value!r}")
    fits = len(value) == len(tensor.shape) and all(d in (-1, n) for d, n in zip(tensor.shape, value, strict=True))
    if not fits:
        raise InvalidTensor(f"input {tensor.name!r} has shape {value}; the model takes {list(tensor.shape)}")
    return value


def _validation_message(exc: ValidationError) -> tuple[str, list[dict[str, Any]]]:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    details = []
    for error in errors[:20]:
        row, *path = error["loc"]
        location = f"rows[{row}]" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        details.append({"loc": location, "msg": error["msg"], "type": error["type"]})
    message = f"{details[0]['loc']}: {details[0]['msg']}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return message, details


class V2Codec:
    """Decodes V2 inference requests to instances and encodes outputs, for one model's tensors."""

    def __init__(self, spec: ModelSpec, max_instances: int | None = None, max_elements: int | None = None) -> None:
        self.max_instances = max_instances
        self.max_elements = max_elements
        self.name = spec.name
        self.version = spec.version
        self.binding = bind(spec)
        self.inputs = {t.name: t for t in self.binding.inputs}
        self.outputs = {t.name: t for t in self.binding.outputs}
        self._all_json = tuple(RequestedOutput(t, binary=False) for t in self.binding.outputs)
        self._all_binary = tuple(RequestedOutput(t, binary=True) for t in self.binding.outputs)
        item: Any = spec.input_type
        validate = self.binding.to_instances.validated and item is not Any
        self._adapter: TypeAdapter[list[Any]] | None = TypeAdapter(list[item]) if validate else None

    # -- description -------------------------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORM,
            "inputs": [t.describe() for t in self.binding.inputs],
            "outputs": [t.describe() for t in self.binding.outputs],
        }

    def config(self, max_batch_size: int, max_delay_ms: float, settings: Config | None = None) -> dict[str, Any]:
        """The subset of a Triton model configuration that clients such as perf_analyzer read; with the model's
        `settings`, its instance count and queue policy too, in Triton's field names."""
        config: dict[str, Any] = {
            "name": self.name,
            "platform": PLATFORM,
            "backend": PLATFORM,
            "max_batch_size": max_batch_size,
            "input": [self._config_tensor(t) for t in self.binding.inputs],
            "output": [self._config_tensor(t) for t in self.binding.outputs],
        }
        if settings is not None:
            config["instance_group"] = [{"count": settings.model_workers, "kind": "KIND_CPU"}]
        if max_batch_size > 1:
            batching: dict[str, Any] = {"max_queue_delay_microseconds": round(max_delay_ms * 1000)}
            if settings is not None:
                policy: dict[str, Any] = {"max_queue_size": settings.max_queue}
                if settings.timeout_ms is not None:
                    policy["default_timeout_microseconds"] = settings.timeout_ms * 1000
                batching["default_queue_policy"] = policy
                batching["priority_levels"] = settings.priority_levels
                batching["default_priority_level"] = settings.default_priority
            config["dynamic_batching"] = batching
        return config

    @staticmethod
    def _config_tensor(tensor: Tensor) -> dict[str, Any]:
        # Triton's dims leave out the batch dimension; a tensor that has no other is [1] reshaped to [].
        described: dict[str, Any] = {"name": tensor.name, "data_type": _CONFIG_TYPES[tensor.datatype]}
        dims = list(tensor.shape[1:])
        if dims:
            described["dims"] = dims
        else:
            described["dims"] = [1]
            described["reshape"] = {"shape": []}
        return described

    def example(self, instances: list[Any]) -> dict[str, Any] | None:
        """A V2 inference request for the model's example instances, when its inputs can be built from them."""
        if not instances:
            return None
        try:
            inputs = self.binding.to_instances.example(instances)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return None if inputs is None else {"inputs": inputs}

    # -- requests ----------------------------------------------------------------------------------------------
    def decode(self, body: bytes, header_length: str | None = None) -> InferenceRequest:
        """Request bytes -> instances and the outputs asked for. Raises 400 for bad JSON or tensors, 422 for
        instances the model's schema rejects."""
        header, binary = _split(body, header_length)
        try:
            request = orjson.loads(header)
        except orjson.JSONDecodeError as exc:
            raise MalformedRequest(f"request body is not valid JSON: {exc}") from None
        return self.decode_message(request, binary, _may_hold_booleans(header))

    def decode_message(self, message: Any, binary: memoryview, booleans: bool = True) -> InferenceRequest:
        """`decode` of a request already parsed: `message`, the JSON header's object (a gRPC call's, built from
        its protobuf message: protocol/oip/messages.py), and `binary`, the tensor data its `binary_data_size`
        parameters describe; `booleans`: whether JSON `data` may hold a true or false."""
        request = _object(message, "the request")
        parameters = _parameters(request, "request")
        request_id = request.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidTensor("the request id must be a string")
        requested, timeout = self._requested(request, parameters), _timeout(parameters)
        arrays = self._arrays(request.get("inputs"), binary, booleans)
        rows = {array.shape[0] for array in arrays.values()}
        if len(rows) > 1:
            raise InvalidTensor(f"the inputs disagree on the batch dimension: {sorted(rows)}")
        count = rows.pop()
        if count < 1:
            raise InvalidTensor("the batch dimension must hold at least one instance")
        if self.max_instances is not None and count > self.max_instances:
            raise self._too_many_rows()
        instances = self.binding.to_instances(arrays)
        if len(instances) != count:
            raise ModelFailed(f"from_tensors returned {len(instances)} instances for {count} rows")
        if self._adapter is not None:
            try:
                instances = self._adapter.validate_python(instances)
            except ValidationError as exc:
                message, details = _validation_message(exc)
                raise ValidationFailed(message, details=details) from None
        return InferenceRequest(instances, request_id, requested, timeout, parameters.get("priority"))

    def _too_many_rows(self) -> TooManyInstances:
        return TooManyInstances(f"a request may hold at most {self.max_instances} rows (--max-instances)")

    def _arrays(self, inputs: Any, binary: memoryview, booleans: bool = True) -> dict[str, np.ndarray[Any, Any]]:
        """Every input tensor, checked against the model's and decoded from its JSON data or binary data
        (`booleans`: whether the JSON may hold a true or false, which numeric data must not)."""
        if not isinstance(inputs, list) or not inputs:
            raise InvalidTensor("the request must have a non-empty 'inputs' list")
        arrays, offset, elements = {}, 0, 0
        for item in inputs:
            item = _object(item, "each input")
            name = item.get("name")
            if not isinstance(name, str) or name not in self.inputs:
                expected = ", ".join(repr(n) for n in self.inputs)
                raise InvalidTensor(f"unknown input {name!r}: model {self.name!r} takes {expected}")
            tensor = self.inputs[name]
            if name in arrays:
                raise InvalidTensor(f"input {name!r} is given twice")
            if item.get("datatype") != tensor.datatype:
                raise InvalidTensor(
                    f"input {name!r} has datatype {item.get('datatype')!r}; the model takes {tensor.datatype}"
                )
            shape = _shape(item.get("shape"), tensor)
            elements += math.prod(shape)
            if self.max_elements is not None and elements > self.max_elements:  # before any data is decoded
                raise TooManyElements(
                    f"the inputs hold {elements} or more elements; a request may hold at most {self.max_elements} "
                    "(--max-tensor-elements)"
                )
            if self.max_instances is not None and shape and shape[0] > self.max_instances:  # before its data too
                raise self._too_many_rows()
            input_parameters = _parameters(item, f"input {name!r}")
            if "shared_memory_region" in input_parameters:
                raise InvalidTensor("shared-memory tensors are not supported")
            size = input_parameters.get("binary_data_size")
            if size is not None:
                if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                    raise InvalidTensor(f"input {name!r}: binary_data_size {size!r} overruns the binary data")
                arrays[name] = array_from_bytes(name, tensor.datatype, shape, binary[offset : offset + size])
                offset += size
            elif item.get("data") is not None:
                arrays[name] = array_from_json(name, tensor.datatype, shape, item["data"], booleans)
            else:
                raise InvalidTensor(f"input {name!r} has neither 'data' nor binary data")
        if offset != len(binary):
            raise InvalidTensor(f"{len(binary) - offset} bytes of binary data belong to no input")
        missing = [n for n in self.inputs if n not in arrays]
        if missing:
            raise InvalidTensor(f"missing input {missing[0]!r}: model {self.name!r} takes {list(self.inputs)}")
        return arrays

    def _requested(self, request: dict[str, Any], parameters: dict[str, Any]) -> tuple[RequestedOutput, ...]:
        binary_default = parameters.get("binary_data_output") is True
        outputs = request.get("outputs")
        if outputs is None:
            return self._all_binary if binary_default else self._all_json
        if not isinstance(outputs, list):
            raise InvalidTensor("'outputs' must be a list")
        requested = []
        for item in outputs:
            item = _object(item, "each requested output")
            name = item.get("name")
            tensor = self.outputs.get(name) if isinstance(name, str) else None
            if tensor is None:
                expected = ", ".join(repr(n) for n in self.outputs)
                raise InvalidTensor(f"unknown output {name!r}: model {self.name!r} returns {expected}")
            output_parameters = _parameters(item, f"output {name!r}")
            unsupported = [p for p in _UNSUPPORTED_PARAMETERS if output_parameters.get(p)]
            if unsupported:
                raise InvalidTensor(f"output {name!r}: parameter {unsupported[0]!r} is not supported")
            binary = output_parameters.get("binary_data", binary_default)
            requested.append(RequestedOutput(tensor, binary is True))
        return tuple(requested)

    # -- responses ---------------------------------------------------------------------------------------------
    def encode(self, request: InferenceRequest, outputs: Any) -> tuple[bytes, int | None]:
        """Outputs -> response bytes, and the JSON header's length when binary tensor data follows it."""
        response, buffers = self.encode_message(request, outputs)
        body = dumps(response)
        if not buffers:
            return body, None
        return body + b"".join(buffers), len(body)

    def encode_message(self, request: InferenceRequest, outputs: Any) -> tuple[dict[str, Any], list[bytes]]:
        """`encode` without the bytes: the JSON header's object, and the binary data of the outputs asked for as
        binary, in order (a gRPC reply is built from these: protocol/oip/messages.py)."""
        if not isinstance(outputs, list | tuple | np.ndarray):
            raise OutputMismatch(f"predict must return a list, got {type(outputs).__name__}")
        expected = len(request.instances)
        if len(outputs) != expected:
            raise OutputMismatch(f"predict returned {len(outputs)} outputs for {expected} inputs")
        arrays = self.binding.to_arrays(outputs, [r.tensor.name for r in request.outputs])
        described, buffers = [], []
        for requested in request.outputs:
            tensor, array = requested.tensor, arrays[requested.tensor.name]
            entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(array.shape)}
            if requested.binary:
                buffers.append(array_to_bytes(array))
                entry["parameters"] = {"binary_data_size": len(buffers[-1])}
            else:
                entry["data"] = array_to_json(array)
            described.append(entry)
        response = {
            "model_name": self.name,
            "model_version": self.version,
            "id": request.id if request.id is not None else (current_request_id() or ""),
            "outputs": described,
        }
        return response, buffers


def _may_hold_booleans(header: bytes | memoryview) -> bool:
    """Whether a JSON header may hold a `true` or `false`: only then is numeric data searched for one."""
    text = header if isinstance(header, bytes) else header.tobytes()
    return b"true" in text or b"false" in text


def _split(body: bytes, header_length: str | None) -> tuple[bytes | memoryview, memoryview]:
    """The JSON header and the binary tensor data after it (none without `Inference-Header-Content-Length`)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise InvalidTensor(f"{HEADER_LENGTH} must be between 0 and the body length, got {header_length!r}")
    view = memoryview(body)
    return view[:length], view[length:]


def _timeout(parameters: dict[str, Any]) -> int | None:
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise InvalidTensor(f"parameter 'timeout' must be a positive number of microseconds, got {timeout!r}")
    return timeout


def statistics(name: str, version: str, totals: InferenceTotals) -> dict[str, Any]:
    """One model's entry of Triton's statistics extension, from twinserve's counters (summed over processes).

    Counts are of requests (V1 and V2 alike), durations cumulative: success and fail the whole request, queue the
    wait for a batch, compute_infer the predict call each request was in. compute_input and compute_output are
    not measured apart: they count what compute_infer counts, with no duration (perf_analyzer refuses compute
    counts that differ); cache counts are per instance, with no duration.
    """

    def stat(count: float, seconds: float = 0.0) -> dict[str, int]:
        return {"count": int(count), "ns": round(seconds * 1e9)}

    return {
        "name": name,
        "version": version,
        "inference_count": int(totals.instances),
        "execution_count": int(totals.batches),
        "inference_stats": {
            "success": stat(totals.succeeded, max(0.0, totals.seconds - totals.failed_seconds)),
            "fail": stat(totals.requests - totals.succeeded, totals.failed_seconds),
            "queue": stat(totals.computed, totals.queue_seconds),
            "compute_input": stat(totals.computed),
            "compute_infer": stat(totals.computed, totals.compute_seconds),
            "compute_output": stat(totals.computed),
            "cache_hit": stat(totals.cache_hits),
            "cache_miss": stat(totals.cache_misses),
        },
    }
