"""`twinserve bench`: the same model under every architecture and setting, driven at every load level.

Each server is started the way a user starts it (`twinserve serve`, a subprocess on a free loopback port) and
measured from outside: load from `loadgen` (or wrk, or Locust), its process tree from psutil, its own /metrics.
Over a model repository each architecture's server serves the whole repository, and the levels are driven at one
model (and version) after another (`BenchTarget`), each one `Run`.
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
from typing import Any

import httpx
import psutil

from twinserve import __version__
from twinserve.core.threads import usable_cores
from twinserve.errors import ConfigError
from twinserve.lab import drivers
from twinserve.lab.ceiling import measure_in_subprocess, thread_caps
from twinserve.lab.plan import BenchPlan, BenchTarget
from twinserve.lab.probe import TreeSampler, scrape, server_stats
from twinserve.lab.results import Ceiling, Level, Machine, Results, Run
from twinserve.lab.servers import ServerFailed, TwinserveServer, free_port, loopback, request_bodies
from twinserve.lab.variants import SWEEPABLE, Arch, Variant, variants
from twinserve.lab.verdicts import verdicts
from twinserve.repository.layout import read_repository

__all__ = ["SWEEPABLE", "Arch", "Variant", "repository_targets", "run_bench", "this_machine", "variants"]


def repository_targets(root: Path, model: str | None = None, version: str | None = None) -> list[BenchTarget]:
    """What to measure in the repository at `root`: `model` (every servable model when None), at `version`
    (each model's default version when None). Raises ConfigError naming what is not there."""
    folders = {folder.name: folder for folder in read_repository(root)}
    if model is not None and model not in folders:
        raise ConfigError(f"--model: {root} has no model {model!r} (it has: {', '.join(folders) or 'none'})")
    if version is not None and model is None:
        raise ConfigError("--version: name the model too (--model NAME)")
    chosen = [folders[model]] if model is not None else [f for f in folders.values() if f.error is None]
    targets: list[BenchTarget] = []
    for folder in chosen:
        if folder.error is not None:
            raise ConfigError(f"--model: {folder.error}")
        by_number = {str(v.version): v for v in folder.versions}
        if version is not None and version not in by_number:
            raise ConfigError(f"--version: {folder.name!r} serves versions {', '.join(by_number)}, not {version!r}")
        number = version if version is not None else str(folder.default_version)
        targets.append(BenchTarget(folder.name, number, version is not None, by_number[number].target))
    if not targets:
        raise ConfigError(f"--model-repository: no model of {root} can be served")
    return targets


#: Told of progress: (event, run label, level description or None, seconds this step takes).
Progress = Callable[[str, str, str | None, float], None]


def this_machine() -> Machine:
    """The machine this process runs on, as a results file records it."""
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
    if mode != "closed":
        return f"{load:g} req/s"
    return f"{load:g} conn{'' if load == 1 else 's'}"


@dataclass
class _Sent:
    """What the servers were first sent: the model's name, the request bodies, and the model's import string
    (what the in-process ceiling measures), and for a repository the target."""

    model_name: str = ""
    bodies: list[bytes] = field(default_factory=list)
    model: str = ""
    target: BenchTarget | None = None


def settings_flags(settings: dict[str, Any]) -> list[str]:
    """A variant's settings as `twinserve serve` flags (`max_batch_size=8` is `--max-batch-size 8`; None: unset)."""
    flags: list[str] = []
    for name, value in settings.items():
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def _label(variant: Variant, target: BenchTarget | None) -> str:
    return variant.label if target is None else f"{variant.label} {target.describe()}"


def _routes(plan: BenchPlan, base: str, target: BenchTarget | None) -> tuple[str, str, list[bytes]]:
    """The model's name, the URL to drive and its bodies: the first listed model's (MODEL), or the target's."""
    if target is not None:
        ready = loopback().get(f"{base}/v2/models/{target.model}/versions/{target.version}/ready", timeout=30)
        if ready.status_code != 200:
            raise ValueError(f"model {target.describe()} is not ready in the repository (see the server's log)")
    name, bodies = request_bodies(base, plan.payload, model=target.model if target is not None else None)
    versioned = target is not None and target.versioned
    version = f"/versions/{target.version}" if target is not None and versioned else ""
    url = f"{base}/v1/models/{name}{version}:predict"
    if plan.protocol == "v2":
        url, bodies = drivers.v2_requests(base, name, bodies, plan.payload)
        url = f"{base}/v2/models/{name}{version}/infer"
    return name, url, bodies


def _measure(plan: BenchPlan, variant: Variant, progress: Progress, sent: _Sent) -> list[Run]:
    """One server of `variant`, driven at every level for each target (the one MODEL, or each repository model)."""
    slug = variant.label.replace(" ", "_").replace("=", "-")
    grpc_port = free_port() if plan.protocol == "grpc" else None
    served = ["--model-repository", str(plan.repository)] if plan.repository is not None else []
    server = TwinserveServer(
        [] if plan.repository is not None else [plan.model],
        variant.arch,
        *served,
        *settings_flags(variant.settings),
        *(["--grpc-port", str(grpc_port)] if grpc_port is not None else []),
        env={"TWINSERVE_LOG_FORMAT": "json"},
        log_path=plan.out / "logs" / f"{slug}.log",
        ready_timeout=plan.ready_timeout_s,
    )
    targets: list[BenchTarget | None] = list(plan.targets) if plan.repository is not None else [None]
    runs = [
        Run(
            label=_label(variant, target),
            arch=variant.arch,
            settings=variant.settings,
            command=server.display_command(),
            model=target.model if target is not None else None,
            version=target.version if target is not None else None,
        )
        for target in targets
    ]
    progress("start", variant.label, None, 0.0)
    try:
        with server:
            snapshot = scrape(server.url)
            roles = snapshot.roles if snapshot is not None else {}
            with TreeSampler(server.pid, roles=roles) as idle:
                idle_wait = min(1.0, plan.warmup_s or 1.0)
                progress("idle", variant.label, None, idle_wait)
                time.sleep(idle_wait)  # what the server holds before any load
            for run, target in zip(runs, targets, strict=True):
                run.startup_s, run.idle = server.startup_s, idle.result()
                _drive_levels(plan, server, run, target, roles, grpc_port, progress, sent)
    except ServerFailed as exc:
        for run in runs:
            run.error = str(exc)
        progress("failed", variant.label, None, 0.0)
    return runs


def _drive_levels(
    plan: BenchPlan,
    server: TwinserveServer,
    run: Run,
    target: BenchTarget | None,
    roles: dict[int, str],
    grpc_port: int | None,
    progress: Progress,
    sent: _Sent,
) -> None:
    """Every level of the plan at one model (and version) of a running server, into `run`."""
    try:
        name, url, bodies = _routes(plan, server.url, target)
        if not sent.bodies:  # the in-process ceiling measures the model the servers were first sent
            sent.model_name, sent.bodies, sent.target = name, bodies, target
            sent.model = target.target if target is not None else plan.model
        grpc_target = f"127.0.0.1:{grpc_port}" if grpc_port is not None else None
        for mode, load in plan.levels():
            progress("level", run.label, _describe(mode, load), plan.warmup_s + plan.duration_s)
            before = scrape(server.url)
            with TreeSampler(server.pid, roles=roles) as sampler:
                figures = drivers.drive(plan, url, bodies, mode, load, grpc_target)
            level = Level.model_validate(
                {**figures, "resources": sampler.result(), "server": server_stats(before, scrape(server.url))}
            )
            run.levels.append(level)
            progress("done", run.label, _describe(mode, load), 0.0)
    except (ValueError, httpx.HTTPError, drivers.DriverError) as exc:
        run.error = str(exc)
        progress("failed", run.label, None, 0.0)


def run_bench(plan: BenchPlan, progress: Progress, on_run: Callable[[Run], None] | None = None) -> Results:
    """Measure every variant at every level, in order; never raises for a server that fails, records it."""
    plan.out.mkdir(parents=True, exist_ok=True)
    sent = _Sent()
    ceiling: list[Ceiling] = []
    runs: list[Run] = []
    for variant in plan.variants:
        for run in _measure(plan, variant, progress, sent):
            runs.append(run)
            if on_run is not None:
                on_run(run)
    # The in-process ceiling comes last, with no server competing for the cores, on the bodies the servers got.
    if sent.bodies and plan.ceiling_sizes:
        progress("ceiling", "in-process", None, 2.0 * len(plan.ceiling_sizes))
        try:
            # Under each math-thread cap a server gives its processes: what N processes can compute together.
            caps = thread_caps(usable_cores())
            ceiling = measure_in_subprocess(sent.model, sent.bodies, plan.ceiling_sizes, plan.out, threads=caps)
        except (RuntimeError, OSError) as exc:
            progress("failed", "in-process", str(exc), 0.0)
    results = Results(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        twinserve_version=__version__,
        machine=this_machine(),
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
        repository=str(plan.repository) if plan.repository is not None else None,
    )
    # The article's claims compare architectures on one model: over a repository, the one the ceiling measured.
    first = sent.target
    compared = [r for r in runs if first is None or (r.model, r.version) == (first.model, first.version)]
    results.verdicts = verdicts(results.model_copy(update={"runs": compared}))
    return results
