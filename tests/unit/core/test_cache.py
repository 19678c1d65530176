from __future__ import annotations

import numpy as np
import pytest
from pydantic import BaseModel

from twinserve.core.cache import ResponseCache
from twinserve.errors import OutputMismatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Point(BaseModel):
    x: int
    y: int


def test_equal_instances_share_a_key_whatever_their_key_order() -> None:
    cache = ResponseCache("m@1", 10, None)
    assert cache.key({"a": 1, "b": [1, 2]}) == cache.key({"b": [1, 2], "a": 1})
    assert cache.key(Point(x=1, y=2)) == cache.key({"x": 1, "y": 2})
    assert cache.key(np.array([1.0, 2.0])) == cache.key([1.0, 2.0])
    assert cache.key({"a": 1}) != cache.key({"a": 2})
    assert ResponseCache("other@1", 10, None).key({"a": 1}) != cache.key({"a": 1})


def test_partial_hits_compute_only_the_rest() -> None:
    cache = ResponseCache("m@1", 10, None)
    lookup = cache.lookup(["a", "b"])
    assert lookup.found == {} and lookup.missing == ["a", "b"]
    assert cache.fill(lookup, ["A", "B"]) == ["A", "B"]
    lookup = cache.lookup(["b", "c", "a"])
    assert lookup.found == {0: "B", 2: "A"} and lookup.missing == ["c"]
    assert cache.fill(lookup, ["C"]) == ["B", "C", "A"]
    assert cache.lookup(["a", "c"]).outputs() == ["A", "C"]
    assert cache.describe() == {"entries": 3, "max_entries": 10, "hits": 4, "misses": 3}
    with pytest.raises(OutputMismatch):
        cache.fill(cache.lookup(["d", "e"]), ["only one"])


def test_lru_eviction_and_ttl() -> None:
    clock = Clock()
    cache = ResponseCache("m@1", 2, ttl=10.0, clock=clock)
    for name in ("a", "b"):
        cache.put(cache.key(name), name.upper())
    cache.get(cache.key("a"))  # a is now the most recent
    cache.put(cache.key("c"), "C")  # evicts b
    assert cache.lookup(["a", "b", "c"]).found == {0: "A", 2: "C"}
    clock.now = 10.5
    assert cache.lookup(["a", "c"]).found == {}
    assert cache.describe()["entries"] == 0
