"""The `results.json` schema: what `twinserve bench` measured, read back by `report` and `advise`.

Versioned: `schema_version` changes whenever a field changes meaning; readers refuse versions they do not know.
Latencies are milliseconds, memory MiB, CPU percent of one core (so 2 busy cores read 200).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SCHEMA_VERSION",
    "Ceiling",
    "Level",
    "Machine",
    "ProcessMemory",
    "Resources",
    "Results",
    "Run",
    "ServerStats",
    "Verdict",
    "load_results",
]

SCHEMA_VERSION = 1

Percentiles = dict[str, float | None]  # p50, p90, p95, p99, p999, max, mean


class _Model(BaseModel):
    # protected_namespaces: `Results.model_name` is a field; pydantic before 2.10 warns about any field named
    # `model_*` (it reserves the prefix), and `pydantic>=2.7` is declared.
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Machine(_Model):
    hostname: str
    platform: str
    python: str
    cpu_count: int
    cpu_model: str
    memory_mib: float


class ProcessMemory(_Model):
    pid: int
    role: str  # "server" (a gunicorn/uvicorn process) or "model_worker" (hybrid)
    rss_mib: float
    uss_mib: float | None = None


class Resources(_Model):
    """The server's whole process tree, sampled during a level."""

    samples: int
    processes: int
    rss_mib_mean: float
    rss_mib_max: float
    uss_mib_max: float | None = None
    cpu_percent_mean: float
    cpu_percent_max: float
    per_process: list[ProcessMemory] = Field(default_factory=list)


class ServerStats(_Model):
    """What the server's own /metrics said about a level (deltas over it)."""

    requests: int
    batches: int
    batch_size_mean: float | None
    queue_wait_ms_mean: float | None
    inference_ms_mean: float | None


class Level(_Model):
    """One load level against one server: the load generator's figures, plus the server's resources."""

    driver: Literal["twinserve", "locust", "wrk", "perf_analyzer"] = "twinserve"
    #: What was sent: V1 `:predict`, V2 `/infer` JSON, or the Open Inference Protocol over gRPC (`--grpc-port`).
    protocol: Literal["v1", "v2", "grpc"] = "v1"
    mode: Literal["closed", "open"]
    concurrency: int | None = None
    rate: float | None = None
    achieved_rate: float | None = None
    duration_s: float
    sent: int
    ok: int
    #: 2xx answers that arrived within the window, whenever their requests fell due (the load generator's
    #: `LevelResult.ok_in_window`; None from the other drivers and from files written before it).
    ok_in_window: int | None = None
    http_errors: dict[str, int] = Field(default_factory=dict)
    transport_errors: dict[str, int] = Field(default_factory=dict)
    #: Extra sends of refused requests by a retrying load (the load generator's `LoadSpec.retries`; bench: 0).
    retries: int = 0
    throughput_rps: float
    latency_ms: Percentiles
    service_time_ms: Percentiles = Field(default_factory=dict)
    #: perf_analyzer's mean per-request breakdown, the server's part read from the V2 statistics extension.
    server_side_ms: dict[str, float] = Field(default_factory=dict)
    generator_cpu_percent: float | None = None
    generator_limited: bool = False
    connections_used: int | None = None
    pool_exhausted: bool = False
    resources: Resources | None = None
    server: ServerStats | None = None

    @property
    def errors(self) -> int:
        return sum(self.http_errors.values()) + sum(self.transport_errors.values())

    @property
    def error_rate(self) -> float:
        return self.errors / self.sent if self.sent else 0.0

    @property
    def load(self) -> float:
        """The x-axis value: connections (closed loop) or offered req/s (open loop)."""
        return float((self.concurrency if self.mode == "closed" else self.rate) or 0.0)

    @property
    def load_text(self) -> str:
        """The load in words: "32 connections" or "200 req/s offered"."""
        return f"{self.load:g} connections" if self.mode == "closed" else f"{self.load:g} req/s offered"

    def p(self, name: str) -> float | None:
        return self.latency_ms.get(name)


class Run(_Model):
    """One architecture with one set of settings, across every load level."""

    label: str  # e.g. "async" or "sync workers=4 threads=8"
    arch: Literal["sync", "async", "hybrid"]
    settings: dict[str, int | float | str | None]
    command: list[str]
    startup_s: float | None = None
    idle: Resources | None = None
    levels: list[Level] = Field(default_factory=list)
    error: str | None = None  # why the server could not be started or measured
    #: Over a model repository: the model and version this run drove (None: the one MODEL of the bench).
    model: str | None = None
    version: str | None = None


class Ceiling(_Model):
    """The model's own inference time per batch size, in-process, with no server: what no server can beat."""

    batch_size: int
    batch_ms_median: float
    instances_per_s: float
    #: CPU seconds per wall second while predict ran: about 1 for a single-threaded model, up to the cores for
    #: one whose library computes on several threads (torch, BLAS), whose processes then do not add up.
    cores: float = 1.0
    #: The math-thread cap it ran under (`twinserve.core.threads`); None: the libraries' own count.
    threads: int | None = None


class Verdict(_Model):
    """One claim from the article the project grew from, tested on this model and machine."""

    claim: str
    source: str  # the seed checklist item, e.g. "S20"
    holds: bool | None  # None: these measurements cannot tell
    evidence: str


class Results(_Model):
    schema_version: int = SCHEMA_VERSION
    created: str
    twinserve_version: str
    machine: Machine
    versions: dict[str, str]
    model: str  # the MODEL import string (the repository's path with --model-repository)
    model_name: str
    payload: str  # "examples" or the --payload file
    instances_per_request: float = 1.0
    duration_s: float
    warmup_s: float
    slo_p95_ms: float | None = None
    runs: list[Run]
    ceiling: list[Ceiling] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)
    #: `--model-repository`: the repository every server served; each run names its model and version.
    repository: str | None = None


def load_results(path: str | Path) -> Results:
    """Read a results.json, refusing a schema this version does not know."""
    text = Path(path).read_bytes()
    version = orjson.loads(text).get("schema_version") if text.lstrip().startswith(b"{") else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: not a twinserve results file of schema_version {SCHEMA_VERSION} (found {version})")
    return Results.model_validate_json(text)
