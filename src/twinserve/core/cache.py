"""The response cache in front of inference (S5): per instance, LRU + TTL, off by default.

Keys are the model's name and version plus a hash of the instance's canonical JSON (sorted keys), so equal
instances hit whatever their key order or the request they came in. A request whose instances are partly
cached computes only the rest.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from twinserve.encoding import json_default
from twinserve.errors import OutputMismatch

__all__ = ["Lookup", "ResponseCache"]

_MISSING = object()


@dataclass(frozen=True)
class Lookup:
    keys: list[bytes]
    found: dict[int, Any]  # index -> cached output
    missing: list[Any]  # the instances to compute, in order

    def outputs(self) -> list[Any]:
        return [self.found[i] for i in range(len(self.keys))]


class ResponseCache:
    """A thread-safe LRU of outputs with a time-to-live; `clock` is injectable for tests."""

    def __init__(
        self, namespace: str, max_entries: int, ttl: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.namespace = namespace.encode()
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def key(self, instance: Any) -> bytes:
        canonical = orjson.dumps(
            instance, default=json_default, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
        )
        return hashlib.blake2b(self.namespace + b"\0" + canonical, digest_size=16).digest()

    def get(self, key: bytes) -> Any:
        """The cached output, or the module's `_MISSING` sentinel (see `lookup`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or (self.ttl is not None and self._clock() - entry[0] > self.ttl):
                if entry is not None:
                    del self._entries[key]
                self.misses += 1
                return _MISSING
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: bytes, output: Any) -> None:
        with self._lock:
            self._entries[key] = (self._clock(), output)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def lookup(self, instances: list[Any]) -> Lookup:
        """Keys for every instance, the outputs already cached, and the instances still to compute."""
        keys = [self.key(i) for i in instances]
        found = {}
        for index, key in enumerate(keys):
            output = self.get(key)
            if output is not _MISSING:
                found[index] = output
        return Lookup(keys, found, [x for i, x in enumerate(instances) if i not in found])

    def fill(self, lookup: Lookup, computed: Any) -> list[Any]:
        """Merge outputs computed for `lookup.missing` (in order) with the cached ones, and cache them."""
        missing = [i for i in range(len(lookup.keys)) if i not in lookup.found]
        if not hasattr(computed, "__len__"):
            raise OutputMismatch(f"predict must return a list, got {type(computed).__name__}")
        if len(computed) != len(missing):
            raise OutputMismatch(f"predict returned {len(computed)} outputs for {len(missing)} inputs")
        outputs = dict(lookup.found)
        for index, output in zip(missing, computed, strict=True):
            self.put(lookup.keys[index], output)
            outputs[index] = output
        return [outputs[i] for i in range(len(lookup.keys))]

    def describe(self) -> dict[str, Any]:
        with self._lock:
            size = len(self._entries)
        return {"entries": size, "max_entries": self.max_entries, "hits": self.hits, "misses": self.misses}
