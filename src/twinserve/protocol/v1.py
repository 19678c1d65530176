"""The V1 (TF-Serving / KServe V1) codec: `{"instances": [...]}` in, `{"predictions": [...]}` out; or TF-Serving's
columnar `{"inputs": ...}` in, `{"outputs": ...}` out (a request holds one of the two, never both).

Columnar inputs are a list of instances or an object of equal-length named lists (the batch's columns); outputs
go back the same way when every prediction is an object with the same keys. Parsing and validation are one
pydantic-core pass over the request bytes, so malformed JSON (400) and schema violations (422, naming instance
and field) come from one call. Validation is strict JSON mode, as TF-Serving refuses `true` or `"1.5"` for a float.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, create_model

from twinserve.encoding import dumps, json_default
from twinserve.errors import ClientError, MalformedRequest, OutputMismatch, TooManyInstances, ValidationFailed
from twinserve.protocol.prescan import exceeds

__all__ = [
    "V1Codec",
    "V1Request",
    "check_instance_count",
    "dumps",
    "json_default",
    "json_strictness",
    "reject_non_json_numbers",
    "request_error",
]


#: What may be a NaN or Infinity literal, or a number too large for a double: none is JSON (RFC 8259), yet the
#: one-pass parser would take them in as nan and inf. A cheap scan; only a body that matches is parsed again.
_NOT_JSON_NUMBER = re.compile(rb"NaN|Infinity|[eE]\+?[0-9]{3}")
_NOT_JSON_NUMBER_TEXT = re.compile(_NOT_JSON_NUMBER.pattern.decode())


def reject_non_json_numbers(body: bytes | str) -> None:
    """400 where the body holds NaN, Infinity or an overflowing number (strict orjson rejects all three), as V2 does;
    a match inside a string passes."""
    pattern = _NOT_JSON_NUMBER if isinstance(body, bytes) else _NOT_JSON_NUMBER_TEXT
    if not pattern.search(body):  # type: ignore[arg-type]
        return
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body is not valid JSON: {exc}") from None


#: Whether a body may be columnar: only such a body is parsed a second time to look at its top-level keys.
_INPUTS = re.compile(rb'"inputs"')


@dataclass(frozen=True, slots=True)
class V1Request:
    """A decoded predict request: its instances, and whether it came columnar (answered with `outputs`)."""

    instances: list[Any]
    columnar: bool = False


def json_strictness(input_type: Any) -> bool | None:
    """How a body's instances of `input_type` are validated: in pydantic's strict JSON mode (True), where each value
    must be of the JSON type its field takes: a number for a float (an integer fills it), an integer for an int,
    true or false for a bool, a string for a str (dates, UUIDs, enums are still read from their strings). That is
    TF-Serving's JSON mapping (its REST API guide, "JSON mapping": DT_FLOAT is a JSON number, DT_BOOL true or
    false; `json_tensor.cc` refuses any other JSON type) and the Open Inference Protocol's rule that data matches
    its datatype. None, leaving it to the type's own pydantic config, when that config sets `strict` itself: a
    model that wants pydantic's coercions (`"1.5"` as 1.5) says so with `ConfigDict(strict=False)`."""
    config = getattr(input_type, "model_config", None) or getattr(input_type, "__pydantic_config__", None)
    return None if isinstance(config, Mapping) and "strict" in config else True


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def too_many_instances(max_instances: int | None) -> TooManyInstances:
    return TooManyInstances(f"a request may hold at most {max_instances} instances (--max-instances)")


def check_instance_count(body: bytes | str, max_instances: int | None) -> None:
    """413 when the body's `instances` list surely holds more than `max_instances`, found from the bytes before
    the parser builds a single instance (see protocol/prescan.py)."""
    if max_instances is None:
        return
    raw = body.encode() if isinstance(body, str) else body
    if exceeds(raw, "instances", max_instances):
        raise too_many_instances(max_instances)


def request_error(exc: ValidationError, max_instances: int | None = None) -> ClientError:
    """A request model's validation error as the client sees it: 400 for bad JSON, 413 past `max_instances`, else
    422 naming the field."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    if errors and errors[0]["type"] == "json_invalid":
        return MalformedRequest(f"request body is not valid JSON: {errors[0]['msg']}")
    if errors and errors[0]["type"] == "model_type" and not errors[0]["loc"]:  # the body itself, not an instance
        return ValidationFailed("request body must be a JSON object with an 'instances' list")
    if any(e["type"] == "too_long" and e["loc"] == ("instances",) for e in errors):
        return too_many_instances(max_instances)
    first = errors[0]
    message = f"{_location(first['loc'])}: {first['msg']}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    details = [{"loc": _location(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors[:20]]
    return ValidationFailed(message, details=details)


class V1Codec:
    """Decodes predict requests and encodes responses for one model's instance types."""

    def __init__(self, model_name: str, input_type: Any, output_type: Any, max_instances: int | None = None) -> None:
        self.max_instances = max_instances
        self._request = create_model(
            f"{model_name.title().replace('-', '').replace('_', '')}PredictRequest",
            __config__=ConfigDict(extra="ignore"),
            instances=(list[input_type], Field(min_length=1, max_length=max_instances)),
        )
        #: pydantic's `strict` for a body's instances (`json_strictness`).
        self.strict = json_strictness(input_type)
        self.input_adapter: TypeAdapter[Any] = TypeAdapter(input_type)
        self._rows: TypeAdapter[list[Any]] = TypeAdapter(list[input_type])
        self.output_adapter: TypeAdapter[Any] = TypeAdapter(output_type)

    def input_schema(self) -> dict[str, Any]:
        return self.input_adapter.json_schema()

    def request_schema(self, ref_template: str) -> dict[str, Any]:
        return self._request.model_json_schema(ref_template=ref_template)

    def output_schema(self) -> dict[str, Any]:
        return self.output_adapter.json_schema(mode="serialization")

    def decode(self, body: bytes) -> list[Any]:
        """Request bytes -> validated instances. Raises MalformedRequest (400), TooManyInstances (413) or
        ValidationFailed (422)."""
        return self.read(body).instances

    def read(self, body: bytes) -> V1Request:
        """Request bytes -> validated instances, row or columnar; ClientError (400) for a body with both."""
        reject_non_json_numbers(body)
        if _INPUTS.search(body):
            columnar = self._columnar(body)
            if columnar is not None:
                return columnar
        return V1Request(self._instances(body))

    def _instances(self, body: bytes) -> list[Any]:
        check_instance_count(body, self.max_instances)
        try:
            request = self._request.model_validate_json(body, strict=self.strict)
            return request.instances  # type: ignore[attr-defined, no-any-return]
        except ValidationError as exc:
            raise request_error(exc, self.max_instances) from None

    def _columnar(self, body: bytes) -> V1Request | None:
        """The request, when `inputs` is one of the body's own keys (None: it is not, read the rows)."""
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MalformedRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(document, dict) or "inputs" not in document:
            return None
        if "instances" in document:
            raise ClientError(
                "a request holds 'instances' (row format) or 'inputs' (columnar format), never both",
                details=[{"loc": "inputs", "msg": "not with 'instances'", "type": "exclusive"}],
            )
        rows = _rows(document["inputs"])
        if self.max_instances is not None and len(rows) > self.max_instances:
            raise too_many_instances(self.max_instances)
        try:
            # As JSON, like a row body: strict JSON mode still reads a date or an enum from its string.
            return V1Request(self._rows.validate_json(orjson.dumps(rows), strict=self.strict), columnar=True)
        except ValidationError as exc:
            raise request_error(exc, self.max_instances) from None

    def encode(self, predictions: Any, expected: int, columnar: bool = False) -> bytes:
        """Model outputs -> response bytes (`outputs` for a columnar request). Raises OutputMismatch (500) if the
        count or type is wrong."""
        if not isinstance(predictions, list | tuple | np.ndarray):
            raise OutputMismatch(f"predict must return a list, got {type(predictions).__name__}")
        if len(predictions) != expected:
            raise OutputMismatch(f"predict returned {len(predictions)} outputs for {expected} inputs")
        try:
            if columnar:
                rows = orjson.loads(dumps(list(predictions)))  # as JSON first: a prediction may be a model object
                return dumps({"outputs": _columns(rows)})
            return dumps({"predictions": predictions})
        except TypeError as exc:
            raise OutputMismatch(f"predict returned output that is not JSON serialisable: {exc}") from None


def _rows(inputs: Any) -> list[Any]:
    """Columnar `inputs` as rows (see the module docstring); ValidationFailed (422) for a shape that is neither."""
    if isinstance(inputs, list):
        rows = inputs
    elif isinstance(inputs, dict) and inputs and all(isinstance(v, list) for v in inputs.values()):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) != 1:
            sizes = ", ".join(f"{name!r}: {len(v)}" for name, v in inputs.items())
            raise ValidationFailed(f"inputs: every named input must hold one value per instance ({sizes})")
        rows = [dict(zip(inputs, values, strict=True)) for values in zip(*inputs.values(), strict=True)]
    else:
        raise ValidationFailed("inputs: must be a list of instances or an object of equally long lists")
    if not rows:
        raise ValidationFailed("inputs: must hold at least one instance")
    return rows


def _columns(predictions: list[Any]) -> Any:
    """Predictions as columnar `outputs`: named lists when every one is an object with the same keys."""
    first = predictions[0] if predictions else None
    if isinstance(first, dict) and all(isinstance(p, dict) and p.keys() == first.keys() for p in predictions):
        return {name: [p[name] for p in predictions] for name in first}
    return predictions
