from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict

from twinserve.errors import MalformedRequest, OutputMismatch, ValidationFailed
from twinserve.protocol.v1 import V1Codec


class Row(BaseModel):
    a: int
    b: list[float]


def test_decode_validates_typed_instances() -> None:
    codec = V1Codec("rows", Row, int)
    rows = codec.decode(b'{"instances": [{"a": 1, "b": [1, 2.5]}], "extra": true}')
    assert rows == [Row(a=1, b=[1.0, 2.5])]


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b"{", MalformedRequest, "request body is not valid JSON"),
        (b"", MalformedRequest, "request body is not valid JSON"),
        (b"[1]", ValidationFailed, "request body must be a JSON object with an 'instances' list"),
        (b'{"instances": 3}', ValidationFailed, "instances: Input should be a valid array"),
        (b'{"instances": []}', ValidationFailed, "instances: List should have at least 1 item"),
        (b'{"instances": [{"a": 1, "b": []}, {"a": "x", "b": [1]}]}', ValidationFailed, "instances[1].a:"),
        (b'{"instances": [{"a": 1, "b": ["q"]}]}', ValidationFailed, "instances[0].b[0]:"),
        (b'{"instances": [{"b": [1]}, {}]}', ValidationFailed, "(and 2 more)"),
    ],
)
def test_decode_errors(body: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        V1Codec("rows", Row, int).decode(body)


def test_untyped_instances_are_any_json() -> None:
    codec = V1Codec("echo", Any, Any)
    assert codec.decode(b'{"instances": [1, "a", null, {"k": [true]}]}') == [1, "a", None, {"k": [True]}]


def test_encode_handles_numpy_and_pydantic() -> None:
    codec = V1Codec("rows", Row, Any)
    body = codec.encode([np.arange(3, dtype=np.float32), Row(a=1, b=[2.0]), np.int64(7)], expected=3)
    assert body == b'{"predictions":[[0.0,1.0,2.0],{"a":1,"b":[2.0]},7]}'
    assert codec.encode(np.ones((2, 2)), expected=2) == b'{"predictions":[[1.0,1.0],[1.0,1.0]]}'


def test_encode_checks_count_and_type() -> None:
    codec = V1Codec("x", Any, Any)
    with pytest.raises(OutputMismatch, match="predict returned 1 outputs for 2 inputs"):
        codec.encode([1], expected=2)
    with pytest.raises(OutputMismatch, match="must return a list, got dict"):
        codec.encode({"a": 1}, expected=1)
    with pytest.raises(OutputMismatch, match="not JSON serialisable"):
        codec.encode([object()], expected=1)


def test_integers_past_64_bits_are_answered_as_json_numbers() -> None:
    """JSON numbers have no size limit (RFC 8259 §6) and the request parser takes any integer, so an echo of one
    is valid JSON (orjson alone stops at 64 bits; found by schemathesis)."""
    from twinserve.encoding import dumps

    big = 80515548272881811456
    assert dumps({"predictions": [big, np.arange(2)]}) == b'{"predictions":[80515548272881811456,[0,1]]}'
    with pytest.raises(TypeError):
        dumps({"predictions": [big, float("nan")]})


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        (b'{"a": 1, "b": [true]}', "instances[0].b[0]: Input should be a valid number"),
        (b'{"a": 1, "b": ["1.5"]}', "instances[0].b[0]: Input should be a valid number"),
        (b'{"a": "1", "b": [1]}', "instances[0].a: Input should be a valid integer"),
        (b'{"a": 1.0, "b": [1]}', "instances[0].a: Input should be a valid integer"),
        (b'{"a": true, "b": [1]}', "instances[0].a: Input should be a valid integer"),
    ],
)
def test_values_must_be_of_their_fields_json_type(instance: bytes, message: str) -> None:
    """TF-Serving's JSON mapping (a float tensor takes JSON numbers, an integer one integers): pydantic's strict
    JSON mode, not its coercions, in rows and columns alike."""
    codec = V1Codec("rows", Row, int)
    with pytest.raises(ValidationFailed, match=re.escape(message)):
        codec.decode(b'{"instances": [' + instance + b"]}")
    columns = b'{"inputs": [' + instance + b"]}"
    with pytest.raises(ValidationFailed, match=re.escape(message.replace("instances", "", 1))):
        codec.decode(columns)
    assert V1Codec("floats", list[float], int).decode(b'{"instances": [[1, 2.5]]}') == [[1.0, 2.5]]
    with pytest.raises(ValidationFailed, match=re.escape("instances[0][0]: Input should be a valid number")):
        V1Codec("floats", list[float], int).decode(b'{"instances": [[true]]}')


class Coerced(BaseModel):
    """A model that asks for pydantic's coercions itself."""

    model_config = ConfigDict(strict=False)
    x: float


def test_a_type_that_sets_strict_itself_decides() -> None:
    assert V1Codec("coerced", Coerced, int).decode(b'{"instances": [{"x": "1.5"}]}') == [Coerced(x=1.5)]
