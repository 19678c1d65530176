"""Tensors of the Open Inference Protocol (V2): datatypes as numpy arrays, and a model's tensors bound to its types.

A `TensorBinding` says which tensors a model takes and returns; row i of the batch dimension is instance i. A
model's declared `inputs` / `outputs` (and `from_tensors` / `to_tensors` hooks) win; otherwise the tensors are
derived from its types:

    instance type                                input tensor `input`
    pydantic model, every field an int           INT64 [-1, n_fields], columns in field order
    pydantic model, every field an int or float  FP32 [-1, n_fields]
    str | bytes | bool | int | float (Literal)   BYTES | BYTES | BOOL | INT64 | FP32 [-1]
    list[...] of those, nested                   [-1, -1, ...]; a fixed length from min_length == max_length
    anything else (Any, dicts, other models)     BYTES [-1], each element one instance as JSON text

    output type                                  output tensors
    pydantic model                               one per field, typed as above (JSON text if nothing fits)
    str | bool | int | float, lists of them      one tensor `output`, typed as above
    anything else                                BYTES [-1] `output`, each element one output as JSON text

Arrays convert with vectorised numpy calls, never per element in Python, except BYTES (Python strings).
"""

from __future__ import annotations

import math
import struct
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from twinserve.core.hooks import model_code
from twinserve.errors import InvalidTensor, OutputMismatch
from twinserve.model import ModelSpec, Tensor
from twinserve.protocol.v1 import dumps

__all__ = [
    "NUMPY_DTYPES",
    "InputConverter",
    "OutputConverter",
    "TensorBinding",
    "array_from_bytes",
    "array_from_json",
    "array_to_bytes",
    "array_to_json",
    "bind",
    "output_array",
]

NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
#: The numpy kinds JSON data may decode to for each datatype (JSON has no float for 1.0, so ints fill floats).
_JSON_KINDS = {name: "iu" for name in NUMPY_DTYPES} | {"BOOL": "b", "FP16": "iuf", "FP32": "iuf", "FP64": "iuf"}
_JSON_KINDS["BYTES"] = "U"
_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers", "U": "strings", "O": "mixed values"}
_EXPECTED = {"b": "booleans", "iu": "integers", "iuf": "numbers", "U": "strings"}
_LENGTH = struct.Struct("<I")


# -- arrays ------------------------------------------------------------------------------------------------------
def array_from_json(
    tensor: str, datatype: str, shape: Sequence[int], data: Any, booleans: bool = True
) -> np.ndarray[Any, Any]:
    """`data` (nested or flat, row-major) as an array of `datatype` and `shape`; InvalidTensor (400) if it is not.

    Every element must be of the JSON type the datatype takes (the Open Inference Protocol's "data must match the
    datatype"; TF-Serving's JSON mapping alike): numbers, integers for the integer types, true/false for BOOL,
    strings for BYTES. numpy alone would read `[true, 1.5]` as `[1.0, 1.5]`, so numeric data is searched for a
    JSON boolean, unless the caller knows there is none (`booleans=False`: its body holds no `true` or `false`)."""
    if not isinstance(data, list):
        raise InvalidTensor(f"input {tensor!r}: data must be a list, got {type(data).__name__}")
    try:
        array = np.asarray(data)
    except (ValueError, TypeError):
        raise InvalidTensor(f"input {tensor!r}: data is not a rectangular array") from None
    if datatype == "UINT64" and array.dtype.kind in "fO":
        array = _uint64(tensor, data, array)
    if array.size != math.prod(shape):
        raise InvalidTensor(f"input {tensor!r}: {array.size} data elements do not fill shape {list(shape)}")
    kind = array.dtype.kind
    if array.size and kind in "iuf" and booleans and datatype != "BOOL" and _holds_boolean(data):
        kind = "b"  # a boolean among the numbers: refused as booleans are, below
    if array.size and kind not in _JSON_KINDS[datatype]:
        expected = _EXPECTED[_JSON_KINDS[datatype]]
        raise InvalidTensor(f"input {tensor!r}: {datatype} data must be {expected}, got {_KIND_NAMES.get(kind, kind)}")
    target = NUMPY_DTYPES[datatype]
    if kind in "iu" and target.kind in "iu" and array.size:
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidTensor(f"input {tensor!r}: a value is out of the range of {datatype}")
    return array.astype(target, copy=False).reshape(shape)


def _holds_boolean(data: list[Any]) -> bool:
    """Whether nested lists `data` hold a bool anywhere (a JSON true or false)."""
    pending = [data]
    while pending:
        for item in pending.pop():
            if item is True or item is False:
                return True
            if type(item) is list:
                pending.append(item)
    return False


def _uint64(tensor: str, data: list[Any], array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """UINT64 data numpy read as floats or objects: it does so when values of 2**63 and more mix with smaller
    ones (no signed type holds both), which would lose the large ones' low bits. Read again as integers."""
    exact = np.asarray(data, dtype=object)
    flat = exact.ravel().tolist() if exact.dtype == object and exact.shape == array.shape else None
    if flat is None or not all(type(x) is int for x in flat):
        return array  # not all integers: the usual checks name what is wrong
    if flat and (min(flat) < 0 or max(flat) > np.iinfo(np.uint64).max):
        raise InvalidTensor(f"input {tensor!r}: a value is out of the range of UINT64")
    return np.array(flat, dtype=np.uint64).reshape(array.shape)


def array_from_bytes(tensor: str, datatype: str, shape: Sequence[int], raw: memoryview) -> np.ndarray[Any, Any]:
    """Binary tensor data (little-endian; BYTES as 4-byte length-prefixed elements) as an array. A BYTES element is
    a length and raw bytes, no encoding (the binary data extension): a `str` when it is UTF-8, else `bytes`."""
    count = math.prod(shape)
    if datatype == "BYTES":
        items: list[str | bytes] = []
        offset = 0
        try:
            while offset < len(raw):
                (length,) = _LENGTH.unpack_from(raw, offset)
                offset += _LENGTH.size
                if offset + length > len(raw):
                    raise ValueError
                element = raw[offset : offset + length]
                try:
                    items.append(str(element, "utf-8"))
                except UnicodeDecodeError:
                    items.append(bytes(element))
                offset += length
        except (struct.error, ValueError):
            raise InvalidTensor(f"input {tensor!r}: binary BYTES data is truncated") from None
        if len(items) != count:
            raise InvalidTensor(f"input {tensor!r}: {len(items)} binary elements do not fill shape {list(shape)}")
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = NUMPY_DTYPES[datatype].newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise InvalidTensor(
            f"input {tensor!r}: {len(raw)} binary bytes, but shape {list(shape)} of {datatype} takes "
            f"{count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def array_to_json(array: np.ndarray[Any, Any]) -> Any:
    """The flat, row-major `data` of a response tensor (numpy arrays are serialised by orjson without a copy)."""
    if array.dtype == object:
        return [_text(x) for x in array.ravel().tolist()]
    return array.ravel()  # C-contiguous, as orjson needs: a view when the array already is


def array_to_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Binary tensor data: little-endian, row-major; BYTES as 4-byte length-prefixed elements (`bytes` as they are,
    anything else as UTF-8 text)."""
    if array.dtype == object:
        encoded = [x if isinstance(x, bytes) else _text(x).encode() for x in array.reshape(-1).tolist()]
        return b"".join(_LENGTH.pack(len(b)) + b for b in encoded)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return dumps(value).decode()


def output_array(tensor: Tensor, values: Any) -> np.ndarray[Any, Any]:
    """Outputs for one tensor as its array, checked against its datatype and declared shape (500 if not)."""
    try:
        if tensor.datatype == "BYTES":
            array = np.array(values, dtype=object)
        else:
            array = np.asarray(values, dtype=NUMPY_DTYPES[tensor.datatype])
    except (ValueError, TypeError, OverflowError) as exc:
        raise OutputMismatch(f"output {tensor.name!r} is not a {tensor.datatype} array: {exc}") from None
    fits = array.ndim == len(tensor.shape) and all(d in (-1, n) for d, n in zip(tensor.shape, array.shape, strict=True))
    if not fits:
        raise OutputMismatch(
            f"output {tensor.name!r} has shape {list(array.shape)}; the model declares {list(tensor.shape)}"
        )
    return array


# -- converters --------------------------------------------------------------------------------------------------
class InputConverter(Protocol):
    """Decoded input arrays (keyed by tensor name) -> one instance per row of the batch dimension."""

    tensors: tuple[Tensor, ...]
    #: False when the instances come from the model's own hook: they go to the model as they are.
    validated: bool

    def __call__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> list[Any]: ...
    def example(self, instances: list[Any]) -> list[dict[str, Any]] | None: ...


Outputs = Sequence[Any] | np.ndarray[Any, Any]


class OutputConverter(Protocol):
    """One output per instance -> an array per requested output tensor (row i = output i)."""

    tensors: tuple[Tensor, ...]

    def __call__(self, outputs: Outputs, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]: ...


def _request_input(tensor: Tensor, rows: list[Any]) -> dict[str, Any]:
    array = np.array(rows, dtype=object)  # the values as given: an example shows 5.1, not its FP32 rounding
    return {**tensor.describe(), "shape": list(array.shape), "data": array.reshape(-1).tolist()}


class _Columns:
    """One tensor whose columns are the fields of a pydantic model (keys in field order)."""

    validated = True

    def __init__(self, tensor: Tensor, keys: Sequence[str]) -> None:
        self.tensors: tuple[Tensor, ...] = (tensor,)
        self.keys = tuple(keys)

    def __call__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> list[Any]:
        keys = self.keys
        return [dict(zip(keys, row, strict=True)) for row in arrays[self.tensors[0].name].tolist()]

    def example(self, instances: list[Any]) -> list[dict[str, Any]] | None:
        rows = [[_field(i, k) for k in self.keys] for i in instances]
        return [_request_input(self.tensors[0], rows)]


class _Rows:
    """One tensor; row i is instance i (a scalar, a list, or a string)."""

    validated = True

    def __init__(self, tensor: Tensor) -> None:
        self.tensors: tuple[Tensor, ...] = (tensor,)

    def __call__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> list[Any]:
        rows: list[Any] = arrays[self.tensors[0].name].tolist()
        return rows

    def example(self, instances: list[Any]) -> list[dict[str, Any]] | None:
        return [_request_input(self.tensors[0], instances)]


class _NamedRows:
    """Several tensors; instance i is `{tensor name: row i of that tensor}`."""

    validated = True

    def __init__(self, tensors: tuple[Tensor, ...]) -> None:
        self.tensors = tensors

    def __call__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> list[Any]:
        names = [t.name for t in self.tensors]
        columns = [arrays[name].tolist() for name in names]
        return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]

    def example(self, instances: list[Any]) -> list[dict[str, Any]] | None:
        return [_request_input(t, [_field(i, t.name) for i in instances]) for t in self.tensors]


class _JsonRows:
    """One BYTES tensor; element i is instance i as JSON text."""

    validated = True

    def __init__(self, tensor: Tensor) -> None:
        self.tensors: tuple[Tensor, ...] = (tensor,)

    def __call__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> list[Any]:
        instances = []
        for index, text in enumerate(arrays[self.tensors[0].name].tolist()):
            try:
                instances.append(orjson.loads(text))
            except orjson.JSONDecodeError as exc:
                raise InvalidTensor(f"input {self.tensors[0].name!r}[{index}] is not JSON text: {exc}") from None
        return instances

    def example(self, instances: list[Any]) -> list[dict[str, Any]] | None:
        return [_request_input(self.tensors[0], [dumps(i).decode() for i in instances])]


class _InputHook:
    """The model's own `from_tensors(arrays) -> instances`."""

    validated = False

    def __init__(self, tensors: tuple[Tensor, ...], model: str, hook: Callable[..., Any]) -> None:
        self.tensors = tensors
        self.model = model
        self.hook = hook

    def __call__(self, arrays: Mapping[str, np.ndarray[Any, Any]]) -> list[Any]:
        with model_code(self.model, "from_tensors"):
            return list(self.hook(dict(arrays)))

    def example(self, instances: list[Any]) -> list[dict[str, Any]] | None:
        return None


def _field(value: Any, key: str) -> Any:
    if type(value) is dict or isinstance(value, Mapping):
        return value[key]
    return getattr(value, key)


class _Fields:
    """One tensor per field of the outputs (pydantic models or mappings); `json`: that field as JSON text."""

    def __init__(self, tensors: tuple[Tensor, ...], json: frozenset[str] = frozenset()) -> None:
        self.tensors = tensors
        self.by_name = {t.name: t for t in tensors}
        self.json = json

    def __call__(self, outputs: Outputs, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
        arrays = {}
        for name in names:
            try:
                values = [_field(o, name) for o in outputs]
            except (KeyError, AttributeError):
                raise OutputMismatch(f"an output of predict has no field {name!r} for the output tensor") from None
            if name in self.json:
                values = [dumps(v).decode() for v in values]
            arrays[name] = output_array(self.by_name[name], values)
        return arrays


class _Stack:
    """One tensor; row i is output i (`json`: output i as JSON text)."""

    def __init__(self, tensor: Tensor, json: bool = False) -> None:
        self.tensors: tuple[Tensor, ...] = (tensor,)
        self.json = json

    def __call__(self, outputs: Outputs, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
        values: Any = [dumps(o).decode() for o in outputs] if self.json else outputs
        return {self.tensors[0].name: output_array(self.tensors[0], values)}


class _OutputHook:
    """The model's own `to_tensors(outputs) -> {name: array}`."""

    def __init__(self, tensors: tuple[Tensor, ...], model: str, hook: Callable[..., Any]) -> None:
        self.tensors = tensors
        self.by_name = {t.name: t for t in tensors}
        self.model = model
        self.hook = hook

    def __call__(self, outputs: Outputs, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
        with model_code(self.model, "to_tensors"):
            produced = self.hook(outputs)
        missing = [name for name in names if name not in produced]
        if missing:
            raise OutputMismatch(f"to_tensors returned no {missing[0]!r} tensor")
        return {name: output_array(self.by_name[name], produced[name]) for name in names}


# -- derivation --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorBinding:
    """A model's V2 tensors and the conversions between them and its instances and outputs."""

    to_instances: InputConverter
    to_arrays: OutputConverter

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.to_instances.tensors

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return self.to_arrays.tensors


_SCALARS: tuple[tuple[type, str], ...] = (
    (bool, "BOOL"),
    (str, "BYTES"),
    (bytes, "BYTES"),  # raw elements, as the binary data extension sends them (JSON data: the string's UTF-8)
    (int, "INT64"),
    (float, "FP32"),
)


def _fixed_length(metadata: Sequence[Any]) -> int:
    lo = next((m.min_length for m in metadata if getattr(m, "min_length", None) is not None), None)
    hi = next((m.max_length for m in metadata if getattr(m, "max_length", None) is not None), None)
    return int(lo) if lo is not None and lo == hi else -1


def _tensor_type(annotation: Any, metadata: Sequence[Any] = ()) -> tuple[str, tuple[int, ...]] | None:
    """The datatype and per-instance shape of a scalar or (nested) list type; None if it is neither."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        # `Annotated[list[float], Field(max_length=3)]` carries its constraints inside the FieldInfo.
        metadata = [*metadata, *(m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e]))]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        kinds = {_tensor_type(type(arg)) for arg in typing.get_args(annotation)}
        return kinds.pop() if len(kinds) == 1 else None
    if origin in (list, Sequence):
        args = typing.get_args(annotation)
        inner = _tensor_type(args[0]) if args else None
        if inner is None:
            return None
        return inner[0], (_fixed_length(metadata), *inner[1])
    for python_type, datatype in _SCALARS:
        if annotation is python_type:
            return datatype, ()
    return None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _derive_inputs(input_type: Any) -> InputConverter:
    if _is_model(input_type):
        fields = input_type.model_fields
        kinds = {_tensor_type(f.annotation) for f in fields.values()}
        if fields and kinds <= {("INT64", ()), ("FP32", ())}:
            datatype = "INT64" if kinds == {("INT64", ())} else "FP32"
            keys = [f.alias or name for name, f in fields.items()]
            return _Columns(Tensor("input", datatype, (-1, len(keys))), keys)
    found = _tensor_type(input_type)
    if found is not None:
        return _Rows(Tensor("input", found[0], (-1, *found[1])))
    return _JsonRows(Tensor("input", "BYTES"))


def _derive_outputs(output_type: Any) -> OutputConverter:
    if _is_model(output_type):
        tensors, json = [], set()
        for name, info in output_type.model_fields.items():
            found = _tensor_type(info.annotation, info.metadata)
            if found is None:
                json.add(name)
                found = ("BYTES", ())
            tensors.append(Tensor(name, found[0], (-1, *found[1])))
        if tensors:
            return _Fields(tuple(tensors), frozenset(json))
    found = _tensor_type(output_type)
    if found is not None:
        return _Stack(Tensor("output", found[0], (-1, *found[1])))
    return _Stack(Tensor("output", "BYTES"), json=True)


def bind(spec: ModelSpec) -> TensorBinding:
    """The model's declared tensors and hooks where it has them, derived ones elsewhere."""
    to_instances: InputConverter
    if spec.from_tensors is not None:
        tensors = spec.inputs or _derive_inputs(spec.input_type).tensors
        to_instances = _InputHook(tensors, spec.name, spec.from_tensors)
    elif spec.inputs is None:
        to_instances = _derive_inputs(spec.input_type)
    elif len(spec.inputs) == 1:
        to_instances = _Rows(spec.inputs[0])
    else:
        to_instances = _NamedRows(spec.inputs)
    to_arrays: OutputConverter
    if spec.to_tensors is not None:
        tensors = spec.outputs or _derive_outputs(spec.output_type).tensors
        to_arrays = _OutputHook(tensors, spec.name, spec.to_tensors)
    elif spec.outputs is None:
        to_arrays = _derive_outputs(spec.output_type)
    elif len(spec.outputs) == 1:
        to_arrays = _Stack(spec.outputs[0])
    else:
        to_arrays = _Fields(spec.outputs)
    return TensorBinding(to_instances, to_arrays)
