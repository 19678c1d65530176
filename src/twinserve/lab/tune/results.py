"""Reading `twinserve tune`'s results.json back: its probes as tune's own `ProbeResult`s, and the winner's capacity
as the bench `Results` that the advisor's autoscaling rule (`lab.advise.autoscaling_targets`) reads.

`twinserve k8s --results` takes either file. For tune's, the winner becomes one bench run whose one level is the
probe tune's capacity rests on, so the HPA's target is that probe's requests in flight (Little's law) or CPU, and
memory its PSS per process. At another SLO (`k8s --slo-p95-ms`) the capacity is found again by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from twinserve.lab.results import Level, Machine, Resources, Results, Run, load_results
from twinserve.lab.tune.search import Goal, Probe, ProbeResult
from twinserve.lab.tune.summary import capacity, no_capacity_reason
from twinserve.lab.variants import Variant

__all__ = ["TUNE_KIND", "Measured", "load_measured", "probe_results", "tune_as_results", "tune_capacity"]

#: The `kind` of tune's results.json (bench's has `schema_version` instead).
TUNE_KIND = "twinserve-tune"


@dataclass(frozen=True)
class Measured:
    """What a results file said: bench's `Results`, and for tune's the winner's architecture (None for bench)."""

    results: Results
    tuned_arch: str | None = None
    #: A model of a repository was tuned: the repository the pod serves (its [settings] hold the model's knobs).
    model_repository: Path | None = None
    #: tune's: the capacity the run's one level is, and its basis (or why there is none), in words.
    basis: str | None = None


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
                memory_mib=p.get("memory_mib", p.get("rss_mib", 0.0)),  # rss_mib: written before PSS
                wall_s=p["wall_s"],
                failed=p.get("failed"),
                generator_limited=p.get("generator_limited", False),
                mean_ms=latency.get("mean"),
                resources=None if p.get("resources") is None else Resources.model_validate(p["resources"]),
                error_kinds=dict(p.get("errors_by_kind") or {}),
                log=p.get("log"),
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


def tune_capacity(record: dict[str, Any], slo_p95_ms: float | None = None) -> tuple[ProbeResult | None, str]:
    """The probe tune's capacity rests on (None where there is none), and its basis in words: results.json's
    `capacity` at tune's own SLO, else found again at `slo_p95_ms` by the same rule.

    ValueError when tune found no winner.
    """
    winner = record["decision"]["winner"]
    if winner is None:
        raise ValueError("this tune run found no setting that met its goal: nothing to size the autoscaler on")
    g = record["goal"]
    own = g["slo_p95_ms"]
    slo = slo_p95_ms or own
    probes = probe_results(record)
    stored = record.get("capacity")
    if stored is not None and slo == own:
        return probes[stored["probe"] - 1], f"tune's capacity: {stored['basis']}"
    goal = Goal(slo, g.get("slo_p99_ms"), g.get("target_rps"), g.get("max_memory_mib"))
    found = capacity(probes, winner["label"], winner["stage"], goal, record["plan"]["repeats"])
    again = f" (found again from tune's probes at P95 <= {slo:g} ms; tune's goal was {own:g} ms)" if slo != own else ""
    if found is None:
        reason = no_capacity_reason(probes, winner["label"], winner["stage"], goal)
        return None, f"tune's winner has no capacity at P95 <= {slo:g} ms{again}: {reason}"
    return found.basis, f"tune's capacity{again}: {found.basis_text()}"


def tune_as_results(record: dict[str, Any], slo_p95_ms: float | None = None) -> Results:
    """The tune winner as one bench run whose one level is the probe its capacity rests on (`tune_capacity`; no
    level where it has none), at `slo_p95_ms` (default: tune's own).

    ValueError when tune found no winner.
    """
    basis, _ = tune_capacity(record, slo_p95_ms)
    winner = record["decision"]["winner"]
    slo = slo_p95_ms or record["goal"]["slo_p95_ms"]
    # A model tuned with per-model settings keeps those in its own [settings]: the pod's flags are the server's.
    server_level = record.get("server_settings")
    settings = dict(winner["settings"] if server_level is None else server_level)
    run = Run(
        label=f"tune winner {winner['label']}",
        arch=winner["arch"],
        settings=settings,
        command=list(record.get("serve_command") or []),
        levels=[] if basis is None else [_level(basis)],
    )
    return Results(
        created=record["created"],
        twinserve_version=record["twinserve_version"],
        machine=Machine.model_validate(record["machine"]),
        versions={},
        model=record["model"],
        model_name=record["model_name"],
        payload="examples",
        duration_s=0.0 if basis is None else basis.probe.seconds,
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
        _, basis = tune_capacity(data, slo_p95_ms)
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a twinserve tune results file this version reads ({exc!r} missing)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    repository = data.get("model_repository")
    return Measured(results, results.runs[0].arch, None if repository is None else Path(repository), basis)
