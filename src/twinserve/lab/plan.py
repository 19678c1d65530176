"""What a bench is asked to measure: its `BenchPlan`, and over a model repository the `BenchTarget`s to drive.

Kept apart from the bench that runs it, so that the load drivers (`drivers`) read a plan without importing the bench
that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from twinserve.lab.variants import Variant

__all__ = ["BenchPlan", "BenchTarget"]


@dataclass(frozen=True)
class BenchTarget:
    """One model of a repository to drive load at, and the version that answers."""

    model: str
    version: str
    #: Named with --version: the versioned routes; else the unversioned ones, which the default version answers.
    versioned: bool = False
    #: The version's class as an import string (`path/model.py:Class`), for the in-process ceiling.
    target: str = ""

    def describe(self) -> str:
        return f"{self.model} v{self.version}"


@dataclass
class BenchPlan:
    """What `twinserve bench` is asked to measure: the servers (variants), the load levels, the driver, and where
    the files go."""

    model: str
    variants: list[Variant]
    out: Path
    concurrency: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    arrivals: Literal["poisson", "constant"] = "poisson"
    duration_s: float = 10.0
    warmup_s: float = 2.0
    payload: Path | None = None
    slo_p95_ms: float | None = None
    driver: Literal["twinserve", "wrk", "locust", "perf_analyzer"] = "twinserve"
    #: v1 `:predict`, v2 `/infer` (JSON tensors), or grpc (`--grpc-port`; perf_analyzer is the only gRPC driver).
    protocol: Literal["v1", "v2", "grpc"] = "v1"
    ceiling_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    ready_timeout_s: float = 300.0
    #: A model repository every server serves (`model` is then its path), measured at each of `targets`.
    repository: Path | None = None
    targets: list[BenchTarget] = field(default_factory=list)

    def levels(self) -> list[tuple[Literal["closed", "open"], float]]:
        return [("closed", float(c)) for c in self.concurrency] + [("open", r) for r in self.rates]
