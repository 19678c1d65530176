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
    "HELPER",
    "MODEL_WORKER",
    "PROCESS",
    "ROLES",
    "SCHEMA_VERSION",
    "SERVER",
    "SUPERVISOR",
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

# The roles of a server's processes (ProcessMemory.role).
#: Holds no model and answers no request: gunicorn's arbiter, uvicorn's process manager (--workers > 1).
SUPERVISOR = "supervisor"
#: Answers HTTP (a gunicorn or uvicorn worker); holds the model unless model workers do (hybrid).
SERVER = "server"
#: Holds the model and computes batches for the servers (hybrid).
MODEL_WORKER = "model_worker"
#: Anything else in the tree (multiprocessing's resource tracker).
HELPER = "helper"
#: A process of a server that does not say what its processes are (a peer, not twinserve).
PROCESS = "process"
ROLES = (SUPERVISOR, SERVER, MODEL_WORKER, HELPER, PROCESS)

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
    """One process of the server's tree: its peaks over the level (PSS, USS read once a second and at the end).

    `pss_mib` is what the kernel charges this process, shared pages split among their sharers: the figures of
    a tree add up. `rss_mib` counts every page it maps, shared or not; `uss_mib` only the pages no other process
    maps (what one more such process would cost).
    """

    pid: int
    role: str  # one of ROLES
    rss_mib: float
    pss_mib: float | None = None
    uss_mib: float | None = None


class Resources(_Model):
    """The server's whole process tree, sampled during a level."""

    samples: int
    processes: int
    rss_mib_mean: float
    rss_mib_max: float
    #: The tree's summed PSS at its peak: the memory the server holds, each shared page counted once. None where
    #: the OS does not say (not Linux) and in results written before it was measured.
    pss_mib_max: float | None = None
    uss_mib_max: float | None = None
    cpu_percent_mean: float
    cpu_percent_max: float
    per_process: list[ProcessMemory] = Field(default_factory=list)

    @property
    def memory_mib(self) -> float:
        """The figure verdicts, advice and memory caps use: PSS where measured, else (older results) RSS."""
        return self.pss_mib_max if self.pss_mib_max is not None else self.rss_mib_max

    @property
    def memory_basis(self) -> str:
        return "PSS" if self.pss_mib_max is not None else "RSS"

    def by_role(self) -> dict[str, tuple[int, float]]:
        """role -> (processes, their summed memory in MiB: PSS where measured, else RSS), in ROLES order."""
        counts: dict[str, tuple[int, float]] = {}
        for process in sorted(self.per_process, key=lambda p: ROLES.index(p.role) if p.role in ROLES else 99):
            mib = process.pss_mib if process.pss_mib is not None else process.rss_mib
            n, total = counts.get(process.role, (0, 0.0))
            counts[process.role] = (n + 1, total + mib)
        return counts

    def roles_text(self) -> str:
        """`1 supervisor 25 MiB, 2 server 410 MiB`: each role's processes and their memory (as `by_role`)."""
        return ", ".join(f"{n} {role} {mib:,.0f} MiB" for role, (n, mib) in self.by_role().items())


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
    #: `http_errors` by status and the server's error code from the body (`"503 queue_full"`; the status alone
    #: where the body names none). The load generator's; empty from the other drivers and older files.
    http_error_codes: dict[str, int] = Field(default_factory=dict)
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
        """The load in words: "1 connection", "32 connections" or "200 req/s offered"."""
        if self.mode != "closed":
            return f"{self.load:g} req/s offered"
        return f"{self.load:g} connection{'' if self.load == 1 else 's'}"

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
    source: str  # the article's point, e.g. "S20" (lab.verdicts.SOURCES has its words)
    holds: bool | None  # None: these measurements cannot tell
    evidence: str
    #: For a claim with a magnitude: the claimed one ("5-10% lower") and the measured one, in the same words.
    claimed: str | None = None
    measured: str | None = None


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
