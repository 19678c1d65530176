"""What a `twinserve tune` run's evidence supports, in numbers and words: the winner's capacity (the one figure
tune's summary, its results.json and `twinserve k8s` state), every other candidate against it, and the verdict.

Pure, like the search policy: tests feed it made-up results. The capacity is the highest rate the winner met the
goal at in its final rung and repeats with no miss at or below it (a rate that met once and missed once is not a
capacity); with a target rate, the target. Its basis probe sizes `twinserve k8s`'s autoscaler. Every other
candidate is *clearly behind*, *too close to call*, *slower* (target only) or *not searched at the winner's load*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from twinserve.lab.tune.search import Decision, Goal, Plan, ProbeResult, Ranked, meets
from twinserve.lab.variants import Variant

__all__ = ["Capacity", "Standing", "Summary", "capacity", "final_stages", "no_capacity_reason", "summarize"]

Kind = Literal["winner", "behind", "close", "slower", "not_searched", "missed"]


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _slo(goal: Goal) -> str:
    return f"P95 <= {goal.slo_p95_ms:g} ms" + (f", P99 <= {goal.slo_p99_ms:g} ms" if goal.slo_p99_ms else "")


def _met_text(r: ProbeResult) -> str:
    return f"met the goal at {_rate(r.probe.rate)} req/s ({r.probe.stage}, P95 {_ms(r.p95_ms)} ms)"


def _missed_text(r: ProbeResult, goal: Goal) -> str:
    return f"missed the goal at {_rate(r.probe.rate)} req/s ({r.probe.stage}, {meets(r, goal)[1]})"


def _probe_text(r: ProbeResult, goal: Goal) -> str:
    """`met the goal at 1,821 req/s (rung0, P95 12.3 ms)`, or `missed the goal at ... (rung2, p95 721.0 ms > 50)`."""
    return _met_text(r) if meets(r, goal)[0] else _missed_text(r, goal)


# -- the capacity -----------------------------------------------------------------------------------------------
def final_stages(results: Sequence[ProbeResult], label: str, stage: str) -> list[str]:
    """The winner's final measurements, in order: the stage it won at (its last rung), then each repeat run."""
    found = [stage]
    for r in results:
        s = r.probe.stage
        if r.probe.candidate.label == label and s.startswith("repeat") and s not in found:
            found.append(s)
    return found


@dataclass(frozen=True)
class Capacity:
    """The winner's capacity and its basis (see the module doc)."""

    rate: float  # req/s offered
    basis: ProbeResult  # the probe at `rate` it rests on: the one with the highest P95 there
    number: int  # that probe's number in the run (1-based, as results.json numbers them)
    met_in: int  # final measurements that met the goal at `rate` or above
    measurements: tuple[str, ...]  # the final measurements run (their stages)
    asked: int  # measurements asked for (`--repeats`)
    goal: Goal

    @property
    def target(self) -> bool:
        return self.goal.target_rps is not None

    def basis_text(self) -> str:
        """The basis in one line, for results.json, the summary and the manifests' header."""
        runs = ", ".join(self.measurements)
        met = f"in {self.met_in} of {len(self.measurements)} measurements ({runs}), with no miss at or below it"
        return (
            f"met {_slo(self.goal)} at {_rate(self.rate)} req/s{'' if self.target else ' or above'} {met}; "
            f"P95 {_ms(self.basis.p95_ms)} ms, {_rate(self.basis.throughput_rps)}/s answered there "
            f"(probe {self.number}, {self.basis.probe.stage})"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "rate_rps": self.rate,
            "throughput_rps": self.basis.throughput_rps,
            "p95_ms": self.basis.p95_ms,
            "mean_ms": self.basis.mean_ms,
            "probe": self.number,
            "stage": self.basis.probe.stage,
            "slo_p95_ms": self.goal.slo_p95_ms,
            "target_rps": self.goal.target_rps,
            "met_in": self.met_in,
            "measurements": list(self.measurements),
            "asked": self.asked,
            "basis": self.basis_text(),
        }


def _final(results: Sequence[ProbeResult], label: str, stage: str) -> list[tuple[int, ProbeResult]]:
    stages = set(final_stages(results, label, stage))
    return [(n, r) for n, r in enumerate(results, 1) if r.probe.candidate.label == label and r.probe.stage in stages]


def capacity(results: Sequence[ProbeResult], label: str, stage: str, goal: Goal, asked: int) -> Capacity | None:
    """The capacity of the winner `label`, which won at `stage`, judged at `goal`; None when no rate qualifies."""
    final = _final(results, label, stage)
    judged = [(n, r, meets(r, goal)[0]) for n, r in final]
    lowest_miss = min((r.probe.rate for _, r, ok in judged if not ok), default=math.inf)
    passed = [r for _, r, ok in judged if ok]
    met = [(n, r) for n, r, ok in judged if ok and r.probe.rate < lowest_miss]
    if not met:
        return None
    run = {r.probe.stage for _, r in final}
    measurements = tuple(s for s in final_stages(results, label, stage) if s in run)

    def met_in(rate: float) -> int:  # a measurement that met a higher rate met this one
        return len({r.probe.stage for r in passed if r.probe.rate >= rate})

    rate = max({r.probe.rate for _, r in met}, key=lambda rate: (met_in(rate), rate))
    number, basis = max(((n, r) for n, r in met if r.probe.rate == rate), key=lambda nr: (nr[1].p95_ms or 0.0, nr[0]))
    return Capacity(rate, basis, number, met_in(rate), measurements, asked, goal)


def no_capacity_reason(results: Sequence[ProbeResult], label: str, stage: str, goal: Goal) -> str:
    """Why `capacity` found none, in words."""
    final = [r for _, r in _final(results, label, stage)]
    runs = ", ".join(s for s in final_stages(results, label, stage) if any(r.probe.stage == s for r in final))
    missed = [r for r in final if not meets(r, goal)[0]]
    if not final:
        return "none of its probes is on record"
    if len(missed) == len(final):
        return f"its final measurements ({runs}) met {_slo(goal)} at no rate"
    lowest = min(missed, key=lambda r: r.probe.rate)
    return f"in its final measurements ({runs}) it {_missed_text(lowest, goal)}, at or below every rate they met"


# -- every candidate against the winner -------------------------------------------------------------------------
@dataclass(frozen=True)
class Standing:
    """One candidate against the winner's load, with the numbers that say so."""

    candidate: Variant
    kind: Kind
    text: str
    probes: int
    highest_met: ProbeResult | None = None
    lowest_missed: ProbeResult | None = None
    highest_probed: ProbeResult | None = None

    @property
    def label(self) -> str:
        return self.candidate.label

    def to_dict(self, goal: Goal) -> dict[str, object]:
        def probe(r: ProbeResult | None) -> dict[str, object] | None:
            if r is None:
                return None
            ok, why = meets(r, goal)
            return {"rate_rps": r.probe.rate, "stage": r.probe.stage, "p95_ms": r.p95_ms, "meets": ok, "why": why}

        return {
            "label": self.label,
            "standing": self.kind,
            "text": self.text,
            "probes": self.probes,
            "highest_met": probe(self.highest_met),
            "lowest_missed": probe(self.lowest_missed),
            "highest_probed": probe(self.highest_probed),
        }


def _unprobed_reason(plan: Plan, candidate: Variant, stopped: str) -> str:
    if candidate not in plan.first:
        return (
            f"not searched: never probed (the budget's plan fit {len(plan.first)} of {len(plan.candidates)} "
            "candidates at rung 0, the most promising by prior first)"
        )
    if stopped == "budget":
        return "not searched: never probed (the budget ran out before its turn)"
    return "not searched: never probed"


def _standing(
    plan: Plan,
    results: Sequence[ProbeResult],
    candidate: Variant,
    load: float,
    winner_p95: tuple[float, float] | None,
    stopped: str,
) -> Standing:
    goal = plan.goal
    mine, met, missed = _outcomes(results, candidate, goal)
    if not mine:
        return Standing(candidate, "not_searched", _unprobed_reason(plan, candidate, stopped), 0)
    # The highest rate, and of several probes there the last.
    highest_met = max(reversed(met), key=lambda r: r.probe.rate, default=None)
    highest_probed = max(reversed(mine), key=lambda r: r.probe.rate)
    # A server that did not start fails at every rate.
    failed = next((r for r in missed if r.failed is not None and r.sent == 0), None)
    lowest_missed = failed or min(missed, key=lambda r: r.probe.rate, default=None)

    def standing(kind: Kind, text: str) -> Standing:
        return Standing(candidate, kind, text, len(mine), highest_met, lowest_missed, highest_probed)

    where = f"{_rate(load)} req/s"
    if goal.target_rps is not None and highest_met is not None and winner_p95 is not None:
        best = min(met, key=lambda r: r.p95_ms if r.p95_ms is not None else math.inf)
        low, high = winner_p95
        spread = f"the winner's {_ms(low)}" + (f"-{_ms(high)}" if high != low else "") + " ms"
        if best.p95_ms is not None and best.p95_ms <= high:
            text = f"too close to call: P95 {_ms(best.p95_ms)} ms at {where} ({best.probe.stage}), within {spread}"
            return standing("close", text)
        text = (
            f"slower: met the goal at {where} too, at P95 {_ms(best.p95_ms)} ms ({best.probe.stage}) against {spread}"
        )
        return standing("slower", text)
    if highest_met is not None and highest_met.probe.rate >= load:
        return standing("close", f"too close to call: {_met_text(highest_met)}, at or above the winner's {where}")
    if failed is not None:
        return standing("behind", f"clearly behind: its server did not start ({failed.probe.stage}: {failed.failed})")
    if lowest_missed is not None and lowest_missed.probe.rate <= load:
        text = f"clearly behind: {_missed_text(lowest_missed, goal)}, at or below the winner's {where}"
        return standing("behind", text)
    text = f"not searched at the winner's load ({where}): at its highest rate probed it "
    text += _probe_text(highest_probed, goal)
    if highest_met is not None and highest_met is not highest_probed:
        text += f"; it {_met_text(highest_met)}"
    return standing("not_searched", text)


def _outcomes(
    results: Sequence[ProbeResult], candidate: Variant, goal: Goal
) -> tuple[list[ProbeResult], list[ProbeResult], list[ProbeResult]]:
    """`candidate`'s probes: all of them, those that met the goal, those that missed it."""
    mine = [r for r in results if r.probe.candidate.label == candidate.label]
    return mine, [r for r in mine if meets(r, goal)[0]], [r for r in mine if not meets(r, goal)[0]]


def _evidence(plan: Plan, results: Sequence[ProbeResult], candidate: Variant, stopped: str) -> Standing:
    """A candidate where no setting met the goal: what it was measured at, with nothing to set it against."""
    goal = plan.goal
    mine, met, missed = _outcomes(results, candidate, goal)
    if not mine:
        return Standing(candidate, "not_searched", _unprobed_reason(plan, candidate, stopped), 0)
    lowest_missed = min(missed, key=lambda r: r.probe.rate, default=None)
    highest_met = max(reversed(met), key=lambda r: r.probe.rate, default=None)
    parts = [_met_text(highest_met)] if highest_met is not None else []
    if lowest_missed is not None:
        parts.append(_missed_text(lowest_missed, goal))
    highest_probed = max(reversed(mine), key=lambda r: r.probe.rate)
    return Standing(candidate, "missed", "; ".join(parts), len(mine), highest_met, lowest_missed, highest_probed)


# -- the verdict ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """The verdict: the capacity (or why there is none), every candidate's standing, and the lines that say it."""

    capacity: Capacity | None
    no_capacity: str | None  # where there is a winner but no capacity: why
    standings: list[Standing]
    measured: int  # candidates probed at least once
    lines: list[str]
    repeated: int = 0  # the winner's measurements run (its last rung and each repeat), of `Plan.repeats`


def _stage_capacity(results: Sequence[ProbeResult], label: str, stage: str, goal: Goal) -> float | None:
    """One measurement's own figure: the highest rate it met (a target: its P95 there, if met)."""
    met = [r for r in results if r.probe.candidate.label == label and r.probe.stage == stage and meets(r, goal)[0]]
    if not met:
        return None
    if goal.target_rps is not None:
        return max(r.p95_ms or 0.0 for r in met)
    return max(r.probe.rate for r in met)


def _measurements(results: Sequence[ProbeResult], winner: Ranked) -> list[str]:
    """The winner's final measurements that ran (its last rung at least)."""
    label = winner.candidate.label
    ran = {r.probe.stage for r in results if r.probe.candidate.label == label}
    return [s for s in final_stages(results, label, winner.stage) if s in ran] or [winner.stage]


def _repeats_line(plan: Plan, results: Sequence[ProbeResult], winner: Ranked, stopped: str) -> str:
    goal, label = plan.goal, winner.candidate.label
    stages = _measurements(results, winner)
    figures = [_stage_capacity(results, label, s, goal) for s in stages]
    unit = " ms P95" if goal.target_rps is not None else " req/s"
    shown = ", ".join(
        f"{s} " + ("met nothing" if f is None else (_ms(f) if goal.target_rps is not None else _rate(f)))
        for s, f in zip(stages, figures, strict=True)
    )
    asked = plan.repeats
    short = " (the budget ran out)" if len(stages) < asked and stopped == "budget" else ""
    if len(stages) < asked and not short:
        short = " (the search repeated it no further)"
    if asked == 1:
        return f"Measured once, as asked (--repeats 1): {shown}{unit}."
    if len(stages) == 1:
        return f"Not repeated: measured 1 of {asked} times{short}: {shown}{unit}."
    return f"Repeated {len(stages)} of {asked} times{short}: {shown}{unit}."


def _candidates_line(plan: Plan, standings: list[Standing], pruned: int, stopped: str) -> str:
    total = len(plan.candidates)
    measured = sum(1 for s in standings if s.probes)
    line = f"{measured} of {total} candidates measured"
    if pruned:
        line += f" ({pruned} more pruned before the search)"
    unprobed = [s for s in standings if not s.probes]
    beyond = [s for s in unprobed if s.candidate not in plan.first]
    reached = len(unprobed) - len(beyond)
    why: list[str] = []
    if beyond:
        why.append(
            f"{len(beyond)} not probed as the budget's plan fit {len(plan.first)} at rung 0, the most promising "
            "by prior first"
        )
    if reached:
        why.append(
            f"{reached} not reached before the budget ran out" if stopped == "budget" else f"{reached} not probed"
        )
    return line + ("; " + "; ".join(why) if why else "") + "."


def summarize(
    plan: Plan,
    results: Sequence[ProbeResult],
    decision: Decision,
    *,
    pruned: int = 0,
    elapsed_s: float = 0.0,
    budget_s: float | None = None,
) -> Summary:
    """Everything the run can say (see the module doc); `pruned`: candidates left out before the search."""
    goal = plan.goal
    slo = _slo(goal)
    winner = decision.winner
    lines: list[str] = []
    found: Capacity | None = None
    why_none: str | None = None
    if winner is None:
        lines.append(f"No setting met {slo}" + (f" at {goal.target_rps:g} req/s" if goal.target_rps else "") + ".")
        if decision.ranking:
            closest = decision.ranking[0]
            mine = [r for r in results if r.probe.candidate.label == closest.candidate.label]
            lowest = min(mine, key=lambda r: r.p95_ms if r.p95_ms is not None else math.inf, default=None)
            if lowest is not None:
                lines.append(f"Closest: {closest.candidate.label}: it {_probe_text(lowest, goal)}.")
        standings = [_evidence(plan, results, v, decision.stopped) for v in plan.candidates]
    else:
        label = winner.candidate.label
        found = capacity(results, label, winner.stage, goal, plan.repeats)
        if found is None:
            why_none = no_capacity_reason(results, label, winner.stage, goal)
        load = found.rate if found is not None else (goal.target_rps or winner.rate)
        winner_p95: tuple[float, float] | None = None
        if goal.target_rps is not None:
            p95s = [r.p95_ms for _, r in _final(results, label, winner.stage) if meets(r, goal)[0] and r.p95_ms]
            winner_p95 = (min(p95s), max(p95s)) if p95s else None
        if found is None:
            lines.append(f"Winner: {label}, with no capacity to state: {why_none}.")
        elif found.target:
            lines.append(
                f"Winner: {label}: P95 up to {_ms(found.basis.p95_ms)} ms at {_rate(found.rate)} req/s, met in "
                f"{found.met_in} of {len(found.measurements)} measurements; goal {slo}."
            )
        else:
            lines.append(
                f"Winner: {label}: capacity {_rate(found.rate)} req/s within {slo} (P95 {_ms(found.basis.p95_ms)} "
                f"ms there, {_rate(found.basis.throughput_rps)}/s answered), met in {found.met_in} of "
                f"{len(found.measurements)} measurements with no miss at or below it."
            )
        lines.append(_repeats_line(plan, results, winner, decision.stopped))
        own = f"the winner: {found.basis_text()}" if found is not None else f"the winner, with no capacity: {why_none}"
        standings = [
            Standing(v, "winner", own, sum(1 for r in results if r.probe.candidate.label == label))
            if v.label == label
            else _standing(plan, results, v, load, winner_p95, decision.stopped)
            for v in plan.candidates
        ]
        if decision.runner_up is not None:
            rival = decision.runner_up.candidate
            runner = next((s for s in standings if s.label == rival.label), None)
            runner = runner or _standing(plan, results, rival, load, winner_p95, decision.stopped)
            lines.append(f"Runner-up {runner.label}: {runner.text}.")
    if decision.stopped == "budget":
        lines.append("The budget ran out before the search finished: the pick is the best measured so far.")
    lines.append(_candidates_line(plan, standings, pruned, decision.stopped))
    budget = f" of a {budget_s:g} s budget" if budget_s is not None else ""
    lines.append(f"{len(results)} probes in {elapsed_s:.0f} s{budget}.")
    measured = sum(1 for s in standings if s.probes)
    repeated = 0 if winner is None else len(_measurements(results, winner))
    return Summary(found, why_none, standings, measured, lines, repeated)
