"""Reading `twinserve tune`'s results.json back: its probes as tune's own `ProbeResult`s, and the winner's probes
as the bench `Results` that the advisor's autoscaling rule (`lab.advise.autoscaling_targets`) reads.

`twinserve k8s --results` takes either file (or the folder holding it). For tune's, the winner is one bench run
whose levels are its open-loop probes that met the goal (judged by tune's own `meets`, at the SLO `k8s` sizes on),
so the HPA's per-pod target is the same rule as bench's: the highest-throughput level within the SLO, in flight
there by Little's law (async, hybrid) or its CPU (sync), times `advise.HEADROOM`; memory from that probe's RSS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from twinserve.lab.results import Level, Machine, Resources, Results, Run, load_results
from twinserve.lab.tune_search import Goal, Probe, ProbeResult, meets
from twinserve.lab.variants import Variant

__all__ = ["TUNE_KIND", "Measured", "load_measured", "probe_results", "tune_as_results"]

#: The `kind` of tune's results.json (bench's has `schema_version` instead).
TUNE_KIND = "twinserve-tune"


@dataclass(frozen=True)
class Measured:
    """What a results file said: bench's `Results`, and for tune's the winner's architecture (None for bench)."""

    results: Results
    tuned_arch: str | None = None
    #: A model of a repository was tuned: the repository the pod serves (its [settings] hold the model's knobs).
    model_repository: Path | None = None


def probe_results(record: dict[str, Any]) -> list[ProbeResult]:
    """Every probe of a tune results.json, as the `ProbeResult` that measured it."""
    found: list[ProbeResult] = []
    for p in record["probes"]:
        variant = Variant(p["arch"], dict(p["settings"]))
        latency = p["latency_ms"]
        found.append(
            ProbeResult(
                probe=Probe(variant, p["stage"], p["rate_rps"], p["seconds"]),
                sent=p["sent"],
                errors=p["errors"],
                achieved_rps=p["achieved_rps"],
                throughput_rps=p["throughput_rps"],
                p50_ms=latency.get("p50"),
                p95_ms=latency.get("p95"),
                p99_ms=latency.get("p99"),
                rss_mib=p["rss_mib"],
                wall_s=p["wall_s"],
                failed=p.get("failed"),
                generator_limited=p.get("generator_limited", False),
                mean_ms=latency.get("mean"),
                resources=None if p.get("resources") is None else Resources.model_validate(p["resources"]),
            )
        )
    return found


def _level(r: ProbeResult) -> Level:
    latency = {"p50": r.p50_ms, "p95": r.p95_ms, "p99": r.p99_ms}
    if r.mean_ms is not None:
        latency["mean"] = r.mean_ms
    return Level(
        mode="open",
        rate=r.probe.rate,
        achieved_rate=r.achieved_rps,
        duration_s=r.probe.seconds,
        sent=r.sent,
        ok=r.sent - r.errors,
        throughput_rps=r.throughput_rps,
        latency_ms=latency,
        generator_limited=r.generator_limited,
        resources=r.resources,
    )


def tune_as_results(record: dict[str, Any], slo_p95_ms: float | None = None) -> Results:
    """The tune winner as one bench run: its probes that met the goal, at `slo_p95_ms` (default: tune's own).

    ValueError when tune found no winner.
    """
    winner = record["decision"]["winner"]
    if winner is None:
        raise ValueError("this tune run found no setting that met its goal: nothing to size the autoscaler on")
    g = record["goal"]
    slo = slo_p95_ms or g["slo_p95_ms"]
    goal = Goal(slo, g.get("slo_p99_ms"), None, g.get("max_memory_mib"))
    # Every stage of the winner counts: its capacity search, its later rungs, its repeats.
    met = [r for r in probe_results(record) if r.probe.candidate.label == winner["label"] and meets(r, goal)[0]]
    # A model tuned with per-model settings keeps those in its own [settings]: the pod's flags are the server's.
    server_level = record.get("server_settings")
    settings = dict(winner["settings"] if server_level is None else server_level)
    run = Run(
        label=f"tune winner {winner['label']}",
        arch=winner["arch"],
        settings=settings,
        command=list(record.get("serve_command") or []),
        levels=[_level(r) for r in met],
    )
    return Results(
        created=record["created"],
        twinserve_version=record["twinserve_version"],
        machine=Machine.model_validate(record["machine"]),
        versions={},
        model=record["model"],
        model_name=record["model_name"],
        payload="examples",
        duration_s=max((r.probe.seconds for r in met), default=0.0),
        warmup_s=0.0,
        slo_p95_ms=slo,
        runs=[run],
        ceiling=record.get("ceiling", []),
    )


def load_measured(path: Path, slo_p95_ms: float | None = None) -> Measured:
    """Bench's or tune's results.json (or the folder holding it); OSError or ValueError saying what is wrong."""
    path = path / "results.json" if path.is_dir() else path
    text = path.read_bytes()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != TUNE_KIND:
        return Measured(load_results(path))
    try:
        results = tune_as_results(data, slo_p95_ms)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a twinserve tune results file this version reads ({exc!r} missing)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    repository = data.get("model_repository")
    return Measured(results, results.runs[0].arch, None if repository is None else Path(repository))
