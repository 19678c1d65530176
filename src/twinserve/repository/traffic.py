"""Traffic split and shadow traffic across the versions of one model: a pure policy, no server in it.
A model's `[traffic]` table (its `twinserve.toml`, or the repository API at run time) reads

    split = {"1" = 90, "2" = 10}       # weights, by version: where the unversioned routes send each request
    sticky_header = "X-Session-Id"     # optional: requests with the same value of this header go to one version
    shadow = {version = "3", share = 0.2}  # optional: a share of requests also computed by version 3, compared

A sticky key picks its version by a stable hash (the same in every process and after a restart, unlike Python's
salted `hash()`), else at random; only ready versions share the traffic, and the shadow decision hashes the key
too, so a sticky client is shadowed always or never.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Shadow", "TrafficPolicy", "key_fraction"]

_KEYS = frozenset({"split", "sticky_header", "shadow"})
_SHADOW_KEYS = frozenset({"version", "share"})


class _Headers(Protocol):
    def get(self, key: str, /) -> str | None: ...


@dataclass(frozen=True)
class Shadow:
    """Mirror `share` (0..1) of a model's unversioned requests to `version`; its answers are only compared."""

    version: str
    share: float


@dataclass(frozen=True)
class TrafficPolicy:
    """How one model's unversioned requests are spread over its versions (see the module docstring)."""

    #: Version -> weight (0: drained, loaded but sent no unversioned request); empty: the default takes them all.
    split: Mapping[str, float] = field(default_factory=dict)
    sticky_header: str | None = None
    shadow: Shadow | None = None

    @classmethod
    def parse(cls, table: Any, versions: Collection[str] | None = None) -> TrafficPolicy:
        """A policy from its TOML table or JSON object; ValueError naming the problem. With `versions`, every
        version it names must be one of them."""
        if not isinstance(table, Mapping):
            raise ValueError("[traffic] must be a table: split, sticky_header, shadow")
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ValueError(f"traffic: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(_KEYS))})")
        split = _split({} if table.get("split") is None else table["split"])  # null: no split, as the API says it
        sticky = table.get("sticky_header")
        if sticky is not None and (not isinstance(sticky, str) or not sticky.strip()):
            raise ValueError("traffic.sticky_header must be a header name")
        shadow = _shadow(table["shadow"]) if table.get("shadow") is not None else None
        policy = cls(split, sticky.strip() if sticky else None, shadow)
        if versions is not None:
            policy.check(versions)
        return policy

    def updated(self, table: Any) -> TrafficPolicy:
        """This policy with each part `table` names replaced whole (a `split` by the weights given, not merged
        with the old ones), a part it sets to null removed, and every part it leaves out kept: the repository
        API's change (`{"split": {"1": 100}}` keeps a shadow; `{"shadow": null}` drops it). ValueError as `parse`."""
        return TrafficPolicy.parse({**self.describe(), **table} if isinstance(table, Mapping) else table)

    @property
    def empty(self) -> bool:
        """Whether it changes nothing: no split, no sticky header, no shadow (the default version takes all)."""
        return not self.split and self.sticky_header is None and self.shadow is None

    def check(self, versions: Collection[str]) -> None:
        """ValueError unless every version this policy names is among `versions`."""
        named = set(self.split) | ({self.shadow.version} if self.shadow is not None else set())
        missing = sorted(named - set(versions), key=_number)
        if missing:
            served = ", ".join(sorted(versions, key=_number)) or "none"
            raise ValueError(f"traffic names version(s) {', '.join(missing)}, not served (versions: {served})")

    def describe(self) -> dict[str, Any]:
        """The policy as the API reads and writes it (and as `parse` takes it back)."""
        return {
            "split": {version: _plain(weight) for version, weight in self.split.items()},
            "sticky_header": self.sticky_header,
            "shadow": None if self.shadow is None else {"version": self.shadow.version, "share": self.shadow.share},
        }

    def key(self, headers: _Headers | None) -> str | None:
        """The request's sticky key: its `sticky_header` value (None: no sticky header, or the request has none)."""
        if self.sticky_header is None or headers is None:
            return None
        # Lower case: every front's headers answer to it (the async front's hot path passes a plain dict of them).
        return headers.get(self.sticky_header.lower()) or None

    def primary(self, key: str | None, ready: Collection[str], draw: float | None = None) -> str | None:
        """The version that answers a request with sticky `key` (None: none), among the `ready` versions; None
        when the split names none of them (the default version answers). `draw` in [0, 1) replaces the random
        draw of a request without a key (tests)."""
        weights = [(version, weight) for version, weight in self._ranked() if weight > 0 and version in ready]
        if not weights:
            return None
        total = sum(weight for _, weight in weights)
        point = (key_fraction(key) if key is not None else _draw(draw)) * total
        for version, weight in weights:
            point -= weight
            if point < 0:
                return version
        return weights[-1][0]  # float rounding at the very top

    def shadowed(self, key: str | None, draw: float | None = None) -> str | None:
        """The shadow version, when this request is one of the share mirrored to it; else None."""
        shadow = self.shadow
        if shadow is None or shadow.share <= 0:
            return None
        fraction = key_fraction(key, salt=b"shadow") if key is not None else _draw(draw)
        return shadow.version if fraction < shadow.share else None

    def _ranked(self) -> list[tuple[str, float]]:
        return sorted(self.split.items(), key=lambda item: _number(item[0]))


def key_fraction(key: str, salt: bytes = b"split") -> float:
    """A stable number in [0, 1) for `key`: the same in every process, run and Python version."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8, person=salt).digest()
    return int.from_bytes(digest, "big") / 2**64


def _draw(draw: float | None) -> float:
    return random.random() if draw is None else draw  # a traffic share, not a secret


def _split(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError('traffic.split must map versions to weights, e.g. {"1" = 90, "2" = 10}')
    split: dict[str, float] = {}
    for version, weight in value.items():
        name = str(version)
        if not name.isdigit() or int(name) < 1:
            raise ValueError(f"traffic.split: {name!r} is not a version number")
        # Finite: an infinite weight (TOML's `inf`) would take every request and make the others' shares NaN. Zero
        # drains a version that stays loaded (a versioned request still reaches it).
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < math.inf:
            raise ValueError(
                f"traffic.split: the weight of version {name} must be a finite number, 0 or more, got {weight!r}"
            )
        split[str(int(name))] = float(weight)
    if split and not any(split.values()):
        raise ValueError("traffic.split: at least one version needs a weight above 0")
    return split


def _shadow(value: Any) -> Shadow:
    if not isinstance(value, Mapping) or set(value) - _SHADOW_KEYS or "version" not in value:
        raise ValueError('traffic.shadow must be {version = "3", share = 0.2}')
    version = str(value["version"])
    if not version.isdigit() or int(version) < 1:
        raise ValueError(f"traffic.shadow: {version!r} is not a version number")
    share = value.get("share", 1.0)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise ValueError(f"traffic.shadow.share must be a number from 0 to 1, got {share!r}")
    return Shadow(str(int(version)), float(share))


def _plain(weight: float) -> float | int:
    return int(weight) if weight.is_integer() else weight


def _number(version: str) -> tuple[int, str]:
    return (int(version), version) if version.isdigit() else (-1, version)
