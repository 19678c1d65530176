"""Which architecture and settings to run: the highest throughput that meets the latency objective.

A run's *capacity* is the highest throughput it reached at a level whose P95 met the SLO with no errors. The
advisor keeps the runs that also meet the optional throughput target and memory cap, picks the highest capacity,
and treats capacities within `TIE` of each other as equal, preferring the one that used less memory.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from twinserve.config import Config, load_config
from twinserve.lab.advise.hybrid import hybrid_trails
from twinserve.lab.ceiling import machine_ceiling
from twinserve.lab.options import Option
from twinserve.lab.results import Level, Results, Run
from twinserve.lab.settings_writer import serve_command as command_of

__all__ = ["HEADROOM", "TIE", "Advice", "AutoscalingTargets", "advise", "autoscaling_targets", "serve_command"]

TIE = 0.05  # capacities this close (relative) are a tie on this noisy a measurement; memory decides
#: Autoscaling targets sit this far below what one server sustained within the SLO, so new pods start
#: (which takes a model load) before the running ones cross it.
HEADROOM = 0.8


@dataclass
class Advice:
    slo_p95_ms: float
    choice: Option | None
    meets: bool  # False: nothing met every constraint; `choice` is then the closest option, if any
    lines: list[str] = field(default_factory=list)
    ranking: list[Option] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.lines)


def _settings(run: Run) -> str:
    shown = {k: v for k, v in run.settings.items() if v is not None}
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in shown.items())


def _best_within(run: Run, slo: float) -> Option | None:
    ok = [lv for lv in run.levels if lv.errors == 0 and lv.p("p95") is not None and (lv.p("p95") or 0) <= slo]
    if not ok:
        return None
    return Option(run, max(ok, key=lambda lv: lv.throughput_rps))


def _efficiency(results: Results, option: Option) -> str:
    found = machine_ceiling(results.ceiling, results.machine.cpu_count)
    if found is None:
        return ""
    rate, processes, row = found
    served = option.capacity * results.instances_per_request
    # The cap is worth naming only where it changed the speed: a model measured under one cap used what it needed.
    capped = row.threads is not None and len({c.threads for c in results.ceiling}) > 1
    threads = f", {row.threads} math thread(s) each" if capped else ""
    share = served / rate
    # Two significant digits below 1%: "0%" read as "nothing" for a server at 0.3% of a very fast model's ceiling.
    share_text = f"{share:.0%}" if share >= 0.01 else f"{share * 100:.2g}%"
    return (
        f" That is {share_text} of the model's in-process ceiling on {results.machine.cpu_count} core(s) "
        f"({rate:,.0f} instances/s: {processes} process(es) at batch {row.batch_size}{threads})."
    )


def serve_command(results: Results, run: Run) -> str:
    """The `twinserve serve` command that runs `run`'s architecture and settings on the bench's model."""
    where: dict[str, Any] = (
        {"model_repository": results.repository} if results.repository else {"models": [results.model]}
    )
    settings: dict[str, Any] = {
        name: value for name, value in run.settings.items() if value is not None and name in Config.model_fields
    }
    return shlex.join(command_of(load_config(arch=run.arch, **where, **settings)))


def _excluded(option: Option, advice: Advice, target_rps: float | None, max_memory_mib: float | None) -> str | None:
    """Why `option`, which met the latency objective, is not the pick; None when nothing was picked."""
    if target_rps is not None and option.capacity < target_rps:
        return f"below the {target_rps:g} req/s target"
    if max_memory_mib is not None and (option.memory_mib is None or option.memory_mib > max_memory_mib):
        return f"over the {max_memory_mib:g} MiB memory cap" if option.memory_mib is not None else "memory unmeasured"
    choice = advice.choice
    if choice is None or not advice.meets:
        return None
    if option.capacity >= choice.capacity * (1 - TIE):
        return "as fast within the noise, but more memory"
    return f"{1 - option.capacity / choice.capacity:.0%} less throughput than {choice.run.label}"


def advise(
    results: Results, slo_p95_ms: float, target_rps: float | None = None, max_memory_mib: float | None = None
) -> Advice:
    runs = [r for r in results.runs if r.error is None and r.levels]
    within = [o for o in (_best_within(r, slo_p95_ms) for r in runs) if o is not None]
    eligible = [
        o
        for o in within
        if (target_rps is None or o.capacity >= target_rps)
        and (max_memory_mib is None or (o.memory_mib is not None and o.memory_mib <= max_memory_mib))
    ]
    advice = Advice(slo_p95_ms, None, False)
    constraints = f"P95 <= {slo_p95_ms:g} ms"
    if target_rps is not None:
        constraints += f", >= {target_rps:g} req/s"
    if max_memory_mib is not None:
        constraints += f", <= {max_memory_mib:g} MiB"

    if eligible:
        top = max(o.capacity for o in eligible)
        tied = [o for o in eligible if o.capacity >= top * (1 - TIE)]
        choice = min(tied, key=lambda o: (o.memory_mib if o.memory_mib is not None else float("inf"), -o.capacity))
        advice.choice, advice.meets = choice, True
        advice.ranking = sorted(eligible, key=lambda o: -o.capacity)
        settings = _settings(choice.run)
        advice.lines.append(
            f"Run {choice.run.arch}{' with ' + settings if settings else ''}: it meets {constraints} "
            f"up to {choice.describe()}.{_efficiency(results, choice)}"
        )
        if len(tied) > 1:
            others = ", ".join(o.run.label for o in tied if o is not choice)
            advice.lines.append(
                f"{others} reached within {TIE:.0%} of that throughput, a tie on this measurement; "
                f"{choice.run.label} uses the least memory."
            )
        advice.lines.append(f"Serve it: {serve_command(results, choice.run)}")
    elif within:
        closest = max(within, key=lambda o: o.capacity)
        advice.choice = closest
        advice.lines.append(
            f"Nothing meets {constraints}. Closest: {closest.run.label}, which meets the latency objective up to "
            f"{closest.describe()}."
        )
    else:
        measured = [(lv.p("p95") or float("inf"), r, lv) for r in runs for lv in r.levels if lv.errors == 0]
        if measured:
            p95, run, level = min(measured, key=lambda m: m[0])
            advice.choice = Option(run, level)
            advice.lines.append(
                f"Nothing meets P95 <= {slo_p95_ms:g} ms at any measured load. Closest: {run.label}, "
                f"P95 {p95:.1f} ms at {level.load_text}."
            )
        else:
            advice.lines.append(f"Nothing meets P95 <= {slo_p95_ms:g} ms: every measured level had errors.")

    for run in runs:
        option = next((o for o in within if o.run is run), None)
        if advice.choice is not None and run is advice.choice.run:
            continue
        if option is None:
            advice.lines.append(f"- {run.label}: never met P95 <= {slo_p95_ms:g} ms without errors.")
        else:
            why = _excluded(option, advice, target_rps, max_memory_mib)
            advice.lines.append(f"- {run.label}: {option.describe()}{'; ' + why if why else ''}.")
    for run in results.runs:
        if run.error is not None:
            advice.lines.append(f"- {run.label}: could not be measured ({run.error.splitlines()[0]}).")
    advice.lines += hybrid_trails(within, results.ceiling)
    return advice


@dataclass(frozen=True)
class AutoscalingTargets:
    """Per-pod targets for a HorizontalPodAutoscaler, read off one bench level.

    The level is the highest-throughput one of the architecture whose P95 met the SLO with no errors (one bench
    server is one pod). async and hybrid scale on requests in flight per pod, sync on CPU utilization of the CPU
    requested; each is the measured value times `headroom`.
    """

    arch: str
    basis: Option
    headroom: float
    in_flight_per_pod: float | None = None  # async, hybrid
    cpu_utilization_percent: int | None = None  # sync: percent of the pod's CPU request
    #: Where the basis level comes from, when the results say more than the level (tune's capacity and its basis).
    source: str | None = None

    def describe(self) -> str:
        target = (
            f"{self.cpu_utilization_percent}% CPU utilization"
            if self.cpu_utilization_percent is not None
            else f"{self.in_flight_per_pod:g} requests in flight per pod"
        )
        source = f"; {self.source}" if self.source else ""
        return f"{target} = {self.headroom:g} x {self.basis.run.label} at {self.basis.describe()}{source}"


def _in_flight(level: Level) -> float:
    if level.mode == "closed" and level.concurrency:
        return float(level.concurrency)
    # Open loop: Little's law, requests in the system = arrival rate x time in the system.
    return level.throughput_rps * (level.p("mean") or level.p("p50") or 0.0) / 1000


def autoscaling_targets(
    results: Results, arch: str, slo_p95_ms: float, cpu_request_cores: float = 1.0, headroom: float = HEADROOM
) -> AutoscalingTargets:
    """Autoscaling targets for `arch` from bench `results` (ValueError when no level of it met the SLO)."""
    runs = [r for r in results.runs if r.arch == arch and r.error is None]
    within = [o for o in (_best_within(r, slo_p95_ms) for r in runs) if o is not None]
    if not within:
        raise ValueError(f"no {arch} level in these results met P95 <= {slo_p95_ms:g} ms without errors")
    basis = max(within, key=lambda o: o.capacity)
    if arch != "sync":
        return AutoscalingTargets(arch, basis, headroom, in_flight_per_pod=round(headroom * _in_flight(basis.level), 3))
    if basis.level.resources is None:
        raise ValueError(f"{basis.run.label}: the level has no CPU measurement to set a utilization target from")
    # cpu_percent_mean is percent of one core, the HPA's utilization percent of the pod's request.
    utilization = headroom * basis.level.resources.cpu_percent_mean / cpu_request_cores
    return AutoscalingTargets(arch, basis, headroom, cpu_utilization_percent=max(1, round(utilization)))
