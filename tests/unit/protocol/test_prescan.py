"""The pre-scan that counts a body's instances from its bytes, and the codecs that refuse with it before parsing."""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import orjson
import pytest

from twinserve.errors import InvalidTensor, MalformedRequest, TooManyInstances, ValidationFailed
from twinserve.examples.tabular import Classifier, IrisFeatures
from twinserve.model import ModelSpec
from twinserve.protocol import prescan
from twinserve.protocol.prescan import count_elements, exceeds
from twinserve.protocol.v1 import V1Codec
from twinserve.protocol.v2 import V2Codec
from twinserve.protocol.websocket import MessageError, WebSocketCodec

#: The issue's body: 5 million empty objects (15 MiB).
HOSTILE = b'{"instances":[' + b",".join([b"{}"] * 5_000_000) + b"]}"
MiB = 1 << 20


@pytest.mark.parametrize(
    ("body", "count"),
    [
        (b'{"instances":[1,2,3]}', 3),
        (b' \n{ "instances" :\t[ ] } ', 0),
        (b'{"instances":[{}]}', 1),
        (b'{"a":{"instances":[1,2]},"instances":[[1,2],[3]]}', 2),  # only the top-level key counts
        (b'{"x":"instances","instances":[1]}', 1),  # a value that reads like the key is not it
        (b'{"instances":["a,b","c\\",d]",{"x":[1,2,3]}, "\\\\"]}', 4),  # commas and brackets in strings
        (b'{"k\\"":1, "instances": [ {} , {} ] }', 2),  # an escaped quote in another key
        (b'{"instances":[1,2,3,4,5],"instances":[1]}', 1),  # the last of duplicate keys wins, as in the parser
        (b'{"instanc\\u0065s":[1,2]}', 2),  # escapes in the key are read, as in the parser
        (b'{"instances":[1,2],"parameters":{"a":[1,2,3]}}', 2),
    ],
)
def test_count_elements_counts_the_top_level_array(body: bytes, count: int) -> None:
    assert count_elements(body, "instances") == count
    assert count_elements(body, "instances") == len(json.loads(body)["instances"])


@pytest.mark.parametrize(
    "body",
    [
        b"[1,2]",  # not an object
        b"",
        b'{"instances":{"a":1}}',  # not an array
        b'{"instances":"[1,2,3]"}',
        b'{"other":[1,2,3]}',  # no such key
        b'{"instances":[1,2',  # never closed
        b'{"instances":[1,2]',
        b'{"instances":[1,2]}{"instances":[1,2,3]}',  # not one value
        b"{1:[1,2]}",
    ],
)
def test_count_elements_leaves_to_the_parser_what_it_cannot_tell(body: bytes) -> None:
    assert count_elements(body, "instances") is None
    assert not exceeds(body, "instances", 1)


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([0, -1.5, 1e10, True, False, None])
    if kind in (1, 2):
        return "".join(rng.choice(['"', "\\", ",", "[", "]", "{", "}", ":", "a", " ", "é", "\n"]) for _ in range(5))
    if kind == 3:
        return rng.randrange(1000)
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_random_value(rng, 4) if rng.random() < 0.5 else "instances": _random_value(rng, depth + 1)}


def test_count_elements_agrees_with_the_parser_on_random_documents() -> None:
    rng = random.Random(20)
    for _ in range(500):
        document: dict[str, Any] = {"instances": [_random_value(rng, 1) for _ in range(rng.randrange(6))]}
        if rng.random() < 0.5:
            document = {"before": _random_value(rng, 1), **document, "after": _random_value(rng, 1)}
        body = json.dumps(document, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode()
        assert count_elements(body, "instances") == len(document["instances"]), body


def test_bodies_larger_than_a_chunk_are_counted_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prescan, "CHUNK", 7)  # every string, key and bracket straddles chunk borders somewhere
    document = {"a": 'x\\",[', "instances": [{"k": "v,]"}, [1, [2, "]"]], "s\\"], "b": [1, 2]}
    body = json.dumps(document).encode()
    assert count_elements(body, "instances") == 3
    assert count_elements(json.dumps({"instances": list(range(50))}).encode(), "instances", stop=10) == 11


@pytest.mark.parametrize("tail", [b'"instances":[1]', b'"instanc\\u0065s":[1]'])
def test_a_later_duplicate_key_is_found_past_the_limit(monkeypatch: pytest.MonkeyPatch, tail: bytes) -> None:
    monkeypatch.setattr(prescan, "CHUNK", 64)  # the excess is found in an early chunk, the duplicate much later
    body = b'{"instances":[' + b",".join([b'{"a":1}'] * 100) + b"]," + tail + b"}"
    assert count_elements(body, "instances", stop=10) == 1
    assert not exceeds(body, "instances", 10)


def test_counting_stops_past_the_limit() -> None:
    assert count_elements(HOSTILE, "instances", stop=4096) == 4097
    assert exceeds(HOSTILE, "instances", 4096)
    assert not exceeds(HOSTILE, "instances", 5_000_000)
    assert not exceeds(b'{"instances":[1,2,3]}', "instances", 3)  # fewer commas than the limit: no scan needed


def test_v1_refuses_the_hostile_body_without_building_its_instances() -> None:
    codec = V1Codec("iris", IrisFeatures, Any, max_instances=1024)
    tracemalloc.start()
    try:
        with pytest.raises(TooManyInstances, match=r"at most 1024 instances \(--max-instances\)"):
            codec.decode(HOSTILE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * MiB  # parsing it built ~700 MiB of objects; the scan holds a chunk's arrays and a copy at most


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"instances":[1,2,3,NaN]}', MalformedRequest),  # not JSON, as before: 400 first
        (b'{"instances":[1,2,3],"instances":[1]}', None),  # the last key wins: valid
        (b'{"instances":{"a":1,"b":2,"c":3,"d":4}}', ValidationFailed),  # no array: the parser's 422, as before
        (b'{"instances":[1,2,3,4]}', TooManyInstances),
        (b'{"instances":[1,2,3,4],"instances":[1,2,3,4,5]}', TooManyInstances),
    ],
)
def test_v1_errors_are_those_of_the_parser(body: bytes, error: type[Exception] | None) -> None:
    codec = V1Codec("any", Any, Any, max_instances=3)
    if error is None:
        assert codec.decode(body) == [1]
    else:
        with pytest.raises(error):
            codec.decode(body)


def test_v1_valid_bodies_decode_as_without_the_scan() -> None:
    rng = random.Random(3)
    rows = [{"sepal_length": rng.uniform(1, 9), "sepal_width": 2.5, "petal_length": 1.4, "petal_width": 0.2}]
    body = orjson.dumps({"instances": rows * 1024})
    limited, unlimited = V1Codec("iris", IrisFeatures, Any, 1024), V1Codec("iris", IrisFeatures, Any)
    assert limited.decode(body) == unlimited.decode(body)
    with pytest.raises(TooManyInstances):
        limited.decode(orjson.dumps({"instances": rows * 1025}))


def test_websocket_text_messages_are_counted_before_parsing() -> None:
    v1, v2 = V1Codec("any", Any, Any, 3), V2Codec(ModelSpec(Classifier()), 3)
    codec = WebSocketCodec(Any, v1, v2, max_instances=3)
    with pytest.raises(MessageError) as info:
        codec.decode_text('{"id": "m1", "instances": [1, 2, 3, 4]}')
    assert isinstance(info.value.error, TooManyInstances)
    assert codec.decode_text('{"id": "m2", "instances": [1, 2, 3]}').instances == [1, 2, 3]


def test_v2_rows_past_the_limit_are_refused_from_the_declared_shape() -> None:
    codec = V2Codec(ModelSpec(Classifier()), max_instances=2)
    # The data would not even fill the shape: the declared rows are refused before it is looked at.
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [3, 4], "data": [1.0]}]})
    with pytest.raises(TooManyInstances, match=r"at most 2 rows"):
        codec.decode(body)
    wrong = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 4], "data": [1.0]}]})
    with pytest.raises(InvalidTensor, match="do not fill shape"):  # within the limit: the data's own error
        codec.decode(wrong)
