"""`twinserve bench`: the same model under every architecture and setting, driven at every load level.

Each server is started the way a user starts it (`twinserve serve`, a subprocess on a free loopback port) and
measured from outside: load from `loadgen` (or wrk, or Locust), its process tree from psutil, its own /metrics.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import psutil

from twinserve import __version__
from twinserve.lab import drivers
from twinserve.lab.ceiling import measure_in_subprocess
from twinserve.lab.probe import TreeSampler, scrape, server_stats
from twinserve.lab.results import Ceiling, Level, Machine, Results, Run
from twinserve.lab.servers import ServerFailed, TwinserveServer, free_port, request_bodies
from twinserve.lab.variants import SWEEPABLE, Arch, Variant, variants
from twinserve.lab.verdicts import verdicts

__all__ = ["SWEEPABLE", "Arch", "BenchPlan", "Variant", "run_bench", "variants"]


@dataclass
class BenchPlan:
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

    def levels(self) -> list[tuple[Literal["closed", "open"], float]]:
        return [("closed", float(c)) for c in self.concurrency] + [("open", r) for r in self.rates]


#: Told of progress: (event, run label, level description or None, seconds this step takes).
Progress = Callable[[str, str, str | None, float], None]


def _machine() -> Machine:
    cpu_model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu_model = next(
                (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu_model
            )
    except OSError:
        pass
    return Machine(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        python=platform.python_version(),
        cpu_count=os.cpu_count() or 1,
        cpu_model=cpu_model,
        memory_mib=round(psutil.virtual_memory().total / 1024 / 1024),
    )


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("fastapi", "starlette", "uvicorn", "uvloop", "flask", "gunicorn", "numpy", "scikit-learn", "torch"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _describe(mode: str, load: float) -> str:
    return f"{load:g} conns" if mode == "closed" else f"{load:g} req/s"


@dataclass
class _Sent:
    """What the servers were sent: the first served model's name and the request bodies."""

    model_name: str = ""
    bodies: list[bytes] = field(default_factory=list)


def settings_flags(settings: dict[str, Any]) -> list[str]:
    """A variant's settings as `twinserve serve` flags (`max_batch_size=8` is `--max-batch-size 8`; None: unset)."""
    flags: list[str] = []
    for name, value in settings.items():
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def _measure(plan: BenchPlan, variant: Variant, progress: Progress, sent: _Sent) -> Run:
    slug = variant.label.replace(" ", "_").replace("=", "-")
    grpc_port = free_port() if plan.protocol == "grpc" else None
    server = TwinserveServer(
        [plan.model],
        variant.arch,
        *settings_flags(variant.settings),
        *(["--grpc-port", str(grpc_port)] if grpc_port is not None else []),
        env={"TWINSERVE_LOG_FORMAT": "json"},
        log_path=plan.out / "logs" / f"{slug}.log",
        ready_timeout=plan.ready_timeout_s,
    )
    run = Run(label=variant.label, arch=variant.arch, settings=variant.settings, command=server.display_command())
    progress("start", variant.label, None, 0.0)
    try:
        with server:
            run.startup_s = server.startup_s
            name, bodies = request_bodies(server.url, plan.payload)
            sent.model_name, sent.bodies = name, bodies
            url = f"{server.url}/v1/models/{name}:predict"
            if plan.protocol == "v2":
                url, bodies = drivers.v2_requests(server.url, name, bodies, plan.payload)
                sent.bodies = bodies
            grpc_target = f"127.0.0.1:{grpc_port}" if grpc_port is not None else None
            snapshot = scrape(server.url)
            roles = snapshot.roles if snapshot is not None else {}
            with TreeSampler(server.pid, roles=roles) as idle:
                idle_wait = min(1.0, plan.warmup_s or 1.0)
                progress("idle", variant.label, None, idle_wait)
                time.sleep(idle_wait)  # what the server holds before any load
            run.idle = idle.result()
            for mode, load in plan.levels():
                progress("level", variant.label, _describe(mode, load), plan.warmup_s + plan.duration_s)
                before = scrape(server.url)
                with TreeSampler(server.pid, roles=roles) as sampler:
                    figures = drivers.drive(plan, url, bodies, mode, load, grpc_target)
                level = Level.model_validate(
                    {**figures, "resources": sampler.result(), "server": server_stats(before, scrape(server.url))}
                )
                run.levels.append(level)
                progress("done", variant.label, _describe(mode, load), 0.0)
    except (ServerFailed, ValueError, drivers.DriverError) as exc:
        run.error = str(exc)
        progress("failed", variant.label, None, 0.0)
    return run


def run_bench(plan: BenchPlan, progress: Progress, on_run: Callable[[Run], None] | None = None) -> Results:
    """Measure every variant at every level, in order; never raises for a server that fails, records it."""
    plan.out.mkdir(parents=True, exist_ok=True)
    sent = _Sent()
    ceiling: list[Ceiling] = []
    runs: list[Run] = []
    for variant in plan.variants:
        run = _measure(plan, variant, progress, sent)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    # The in-process ceiling comes last, with no server competing for the cores, on the bodies the servers got.
    if sent.bodies and plan.ceiling_sizes:
        progress("ceiling", "in-process", None, 2.0 * len(plan.ceiling_sizes))
        try:
            ceiling = measure_in_subprocess(plan.model, sent.bodies, plan.ceiling_sizes, plan.out)
        except (RuntimeError, OSError) as exc:
            progress("failed", "in-process", str(exc), 0.0)
    results = Results(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        twinserve_version=__version__,
        machine=_machine(),
        versions=_versions(),
        model=plan.model,
        model_name=sent.model_name or plan.model,
        payload=str(plan.payload) if plan.payload else "examples",
        instances_per_request=drivers.instances_per_request(sent.bodies),
        duration_s=plan.duration_s,
        warmup_s=plan.warmup_s,
        slo_p95_ms=plan.slo_p95_ms,
        runs=runs,
        ceiling=ceiling,
    )
    results.verdicts = verdicts(results)
    return results
