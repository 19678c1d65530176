"""What one load level is asked to do: `LoadSpec`, validated whole when it is made."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from twinserve.lab.loadgen.http import Endpoint

__all__ = ["LoadSpec"]

#: Framing headers the client writes itself.
_RESERVED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True)
class LoadSpec:
    """One load level: POST `bodies` (round-robin) to `url`, in closed loop (`concurrency`) or open loop (`rate`).

    `warmup_s` of load is discarded before `duration_s` is measured. `max_connections` caps the open-loop pool;
    `timeout_s` bounds each request from the moment it falls due. `seed` makes Poisson arrivals repeatable.
    `remote` lets `url` name another host (`twinserve tune --verify` against a deployment); without it only
    loopback servers are driven, so that a lab run cannot load someone else's machine by a typo.
    `retries`: a request answered 429 or 503 is sent again at once, `Retry-After` ignored (a retry storm), up to
    this many times; only its last answer counts, and its latency runs from when it first fell due.
    """

    url: str
    bodies: Sequence[bytes]
    duration_s: float
    warmup_s: float = 0.0
    concurrency: int | None = None
    rate: float | None = None
    arrivals: Literal["poisson", "constant"] = "poisson"
    max_connections: int = 512
    timeout_s: float = 30.0
    headers: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    remote: bool = False
    retries: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be a positive number of requests per second, not {self.rate}")
        for name in ("duration_s", "timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, not {value}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"warmup_s must be zero or more, not {self.warmup_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be zero or more, not {self.retries}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if self.arrivals not in ("poisson", "constant"):
            raise ValueError(f"arrivals must be 'poisson' or 'constant', not {self.arrivals!r}")
        if not self.bodies or not all(isinstance(body, bytes) for body in self.bodies):
            raise ValueError("bodies must be a non-empty sequence of bytes")
        for name, value in self.headers.items():
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"the load generator sets the {name} header itself")
            if any(c in name + value for c in "\r\n") or ":" in name:
                raise ValueError(f"malformed header {name!r}: {value!r}")
        Endpoint.parse(self.url, self.remote)
