"""The V1 (TF-Serving / KServe V1) codec: `{"instances": [...]}` in, `{"predictions": [...]}` out.

Parsing and validation happen in one pass in pydantic-core straight from the request bytes, so malformed JSON
(400) and schema violations (422, naming the instance index and field) come from the same call.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, create_model

from twinserve.encoding import dumps, json_default
from twinserve.errors import ClientError, MalformedRequest, OutputMismatch, TooManyInstances, ValidationFailed
from twinserve.protocol.prescan import exceeds

__all__ = [
    "V1Codec",
    "check_instance_count",
    "dumps",
    "json_default",
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
        self.input_adapter: TypeAdapter[Any] = TypeAdapter(input_type)
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
        reject_non_json_numbers(body)
        check_instance_count(body, self.max_instances)
        try:
            return self._request.model_validate_json(body).instances  # type: ignore[attr-defined, no-any-return]
        except ValidationError as exc:
            raise request_error(exc, self.max_instances) from None

    def encode(self, predictions: Any, expected: int) -> bytes:
        """Model outputs -> response bytes. Raises OutputMismatch (500) if the count or type is wrong."""
        if not isinstance(predictions, list | tuple | np.ndarray):
            raise OutputMismatch(f"predict must return a list, got {type(predictions).__name__}")
        if len(predictions) != expected:
            raise OutputMismatch(f"predict returned {len(predictions)} outputs for {expected} inputs")
        try:
            return dumps({"predictions": predictions})
        except TypeError as exc:
            raise OutputMismatch(f"predict returned output that is not JSON serialisable: {exc}") from None
