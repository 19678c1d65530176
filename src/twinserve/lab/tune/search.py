"""`twinserve tune`'s search policy: successive halving over the candidates, as a pure function.

`next_step(plan, results, spent_s)` answers the next `Probe` to run or the final `Decision`; it starts nothing
and reads no clock, so tests feed it made-up results. Rung 0 probes the first `n0` candidates for `base_s`
seconds; each next rung keeps the better half and doubles the seconds, until one is left, which is repeated: a
runner-up within its spread means the machine was too noisy to decide. A score is, with a target rate, the
negated P95 at it (-inf on a miss); without one, the capacity found by doubling or halving, then bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from twinserve.lab.results import Resources
from twinserve.lab.variants import Variant

__all__ = [
    "Decision",
    "Goal",
    "Plan",
    "Probe",
    "ProbeResult",
    "Ranked",
    "errors_text",
    "meets",
    "next_step",
    "plan_search",
    "probe_cost",
    "warmup_s",
]

#: Capacity searches stop refining once the bracket is this tight (highest met / lowest missed).
RESOLUTION = 1.1
#: No capacity below this is searched for (req/s).
MIN_RATE = 1.0
#: After a miss with no rate met yet, the next rate is at most this share of what the server answered there.
SATURATED = 0.9
#: Open loop: the server must answer this share of the requests that fell due.
ANSWERED = 0.95


@dataclass(frozen=True)
class Goal:
    slo_p95_ms: float
    slo_p99_ms: float | None = None
    target_rps: float | None = None
    max_memory_mib: float | None = None


@dataclass(frozen=True)
class Probe:
    """One measurement to make: `candidate` under `rate` req/s (Poisson) for `seconds`, at `stage`."""

    candidate: Variant
    stage: str  # "rung0", "rung1", ..., "repeat1", ...
    rate: float
    seconds: float


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured (latencies from each request's scheduled send time, ms; memory: the tree's peak PSS)."""

    probe: Probe
    sent: int
    errors: int
    achieved_rps: float
    throughput_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    memory_mib: float
    wall_s: float
    failed: str | None = None  # the server did not start, or the probe could not run
    #: The load generator may have been the limit (it shares the machine): the latencies are an upper bound.
    generator_limited: bool = False
    #: The mean latency (ms): Little's law turns a rate into requests in flight with it (`twinserve k8s`).
    mean_ms: float | None = None
    #: The server's process tree over the probe (PSS and RSS per process and role, CPU): pod sizing and CPU targets.
    resources: Resources | None = None
    #: `errors` by kind: HTTP status and the server's error code (`"503 queue_full"`), transport failures
    #: (`"timeout"`, `"connect_refused"`, ...): `LevelResult.errors_by_kind`.
    error_kinds: dict[str, int] = field(default_factory=dict)
    #: The output of the server the probe ran on (one file per server start).
    log: str | None = None


def errors_text(result: ProbeResult) -> str:
    """`1,704 errors (503 queue_full 1,700, timeout 4)`; the kinds where known."""
    kinds = ", ".join(f"{kind} {n:,}" for kind, n in sorted(result.error_kinds.items(), key=lambda kv: -kv[1]))
    return f"{result.errors:,} errors" + (f" ({kinds})" if kinds else "")


def meets(result: ProbeResult, goal: Goal) -> tuple[bool, str]:
    """Whether the probe met the goal; if not, the first reason."""
    if result.failed is not None:
        return False, result.failed
    if result.sent == 0 or result.p95_ms is None:
        return False, "no responses"
    if result.errors:
        return False, errors_text(result)
    if result.p95_ms > goal.slo_p95_ms:
        return False, f"p95 {result.p95_ms:.1f} ms > {goal.slo_p95_ms:g}"
    if goal.slo_p99_ms is not None and (result.p99_ms is None or result.p99_ms > goal.slo_p99_ms):
        return False, f"p99 {result.p99_ms or math.inf:.1f} ms > {goal.slo_p99_ms:g}"
    # Against what fell due (Poisson: the count in a short window varies), not the asked rate.
    if result.throughput_rps < ANSWERED * result.achieved_rps:
        return False, f"answered {result.throughput_rps:,.0f}/s of {result.achieved_rps:,.0f}/s sent"
    if goal.max_memory_mib is not None and result.memory_mib > goal.max_memory_mib:
        return False, f"memory {result.memory_mib:,.0f} MiB > {goal.max_memory_mib:g}"
    return True, "meets"


@dataclass(frozen=True)
class Plan:
    """A search, fixed before it starts: candidates (most promising first), priors (req/s), goal and budget.

    `overhead_s` is what starting a candidate's server costs, an estimate; the driver keeps a server while the
    probes stay on one candidate, so a stage pays it once, and each probe adds its warm-up (`probe_cost`).
    """

    candidates: Sequence[Variant]
    priors: dict[str, float]
    goal: Goal
    budget_s: float
    repeats: int = 3
    base_s: float = 1.0
    n0: int = 0  # candidates at rung 0 (0: all)
    overhead_s: float = 2.0
    steps: tuple[int, int] = (3, 2)  # capacity search steps at rung 0, and at every later stage

    @property
    def first(self) -> list[Variant]:
        return list(self.candidates[: self.n0 or len(self.candidates)])

    def stage_steps(self, stage: str) -> int:
        if self.goal.target_rps is not None:
            return 1
        return self.steps[0] if stage == "rung0" else self.steps[1]


def warmup_s(seconds: float) -> float:
    """The warm-up the driver runs before a probe of `seconds` counts, on a server that served the last one."""
    return min(1.0, 0.25 * seconds)


def probe_cost(seconds: float) -> float:
    """A probe's wall time on a running server: its warm-up (as the driver runs it), its seconds, the tail."""
    return seconds + warmup_s(seconds) + 0.2


def _planned_cost(
    n0: int, base_s: float, overhead_s: float, repeats: int, steps: tuple[int, int], target: bool
) -> float:
    first, later = (1, 1) if target else steps
    cost, n, seconds, rung = 0.0, n0, base_s, 0
    while True:
        cost += n * (overhead_s + (first if rung == 0 else later) * probe_cost(seconds))
        if n <= 1:
            break
        n, seconds, rung = math.ceil(n / 2), seconds * 2, rung + 1
    # The winner's server is already up for its repeats.
    return cost + (repeats - 1) * later * probe_cost(seconds)


def plan_search(
    candidates: Sequence[Variant],
    priors: dict[str, float],
    goal: Goal,
    budget_s: float,
    *,
    repeats: int = 3,
    min_probe_s: float = 1.0,
    max_probe_s: float = 10.0,
    overhead_s: float = 2.0,
    steps: tuple[int, int] = (3, 2),
) -> Plan:
    """Fit successive halving into `budget_s`: as many candidates at rung 0 as fit at `min_probe_s` (at least
    one), then the longest base probe (up to `max_probe_s`) that still fits."""
    target = goal.target_rps is not None

    def cost(n: int, base: float) -> float:
        return _planned_cost(n, base, overhead_s, repeats, steps, target)

    n0 = max((n for n in range(1, len(candidates) + 1) if cost(n, min_probe_s) <= budget_s), default=1)
    base = min_probe_s
    while base * 1.25 <= max_probe_s and cost(n0, base * 1.25) <= budget_s:
        base *= 1.25
    return Plan(candidates, priors, goal, budget_s, repeats, round(base, 2), n0, overhead_s, steps)


@dataclass(frozen=True)
class Ranked:
    candidate: Variant
    stage: str
    score: float
    rate: float  # the capacity (or the target rate) the score stands for
    p95_ms: float | None


@dataclass(frozen=True)
class Decision:
    """The search's outcome. `samples`: the winner's scores, its last rung and each repeat."""

    winner: Ranked | None
    runner_up: Ranked | None
    samples: list[float]
    too_noisy: bool
    stopped: str  # "done" or "budget"
    ranking: list[Ranked] = field(default_factory=list)

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.samples), max(self.samples)) if self.samples else None


# -- one stage of one candidate ---------------------------------------------------------------------------------
def _stage_results(results: Sequence[ProbeResult], label: str, stage: str) -> list[ProbeResult]:
    return [r for r in results if r.probe.candidate.label == label and r.probe.stage == stage]


def _bracket(done: Sequence[ProbeResult], goal: Goal) -> tuple[float | None, float | None]:
    met = [r.probe.rate for r in done if meets(r, goal)[0]]
    lo = max(met, default=None)
    missed = [r.probe.rate for r in done if not meets(r, goal)[0] and (lo is None or r.probe.rate > lo)]
    return lo, min(missed, default=None)


def _next_rate(done: Sequence[ProbeResult], goal: Goal, start: float, steps: int, wide: bool) -> float | None:
    """The next rate of a capacity search, or None when it is over."""
    if goal.target_rps is not None:
        return None if done else goal.target_rps
    if not done:
        return max(start, MIN_RATE)
    lo, hi = _bracket(done, goal)
    # Out of steps: over, unless nothing has met the goal yet (then a few more halvings may find a rate that does).
    if len(done) >= steps and (lo is not None or len(done) >= 2 * steps):
        return None
    factor = 2.0 if wide else 1.3
    if lo is not None and hi is not None:
        return None if hi / lo <= RESOLUTION else math.sqrt(lo * hi)
    if lo is not None:
        return lo * factor
    assert hi is not None
    lower = hi / factor
    # Only misses so far. An overloaded server still answered what it could: that rate bounds its capacity, a far
    # better next guess than a halving when the prior was far off (as for a predict that already uses every core,
    # where more processes do not add up).
    answered = max(r.throughput_rps for r in done if r.probe.rate == hi)
    if 0 < SATURATED * answered < lower:
        lower = SATURATED * answered
    return None if lower < MIN_RATE else lower


def _score(done: Sequence[ProbeResult], goal: Goal) -> tuple[float, float, float | None]:
    """(score, rate, p95 there) of a finished stage."""
    if goal.target_rps is not None:
        result = done[-1]
        ok = meets(result, goal)[0]
        return (-(result.p95_ms or math.inf) if ok else -math.inf), goal.target_rps, result.p95_ms
    lo, _ = _bracket(done, goal)
    if lo is None:  # nothing met the goal: the lowest rate's P95 says how far off (a tie-break only)
        lowest = min(done, key=lambda r: r.probe.rate)
        return 0.0, 0.0, lowest.p95_ms
    at = next(r for r in done if r.probe.rate == lo)
    return lo, lo, at.p95_ms


def _rank_key(r: Ranked) -> tuple[float, float]:
    return (r.score, -(r.p95_ms if r.p95_ms is not None else math.inf))


# -- the whole search -------------------------------------------------------------------------------------------
def next_step(plan: Plan, results: Sequence[ProbeResult], spent_s: float) -> Probe | Decision:
    """The next probe to run, or the decision: a pure function of the plan, the results so far and the time."""
    survivors = plan.first
    seconds = plan.base_s
    start: dict[str, float] = {v.label: max(plan.priors.get(v.label, MIN_RATE) / 2, MIN_RATE) for v in survivors}
    finished: list[Ranked] = []  # every finished stage, for the ranking
    rung = 0
    last_rung: list[Ranked] = []
    while True:
        stage = f"rung{rung}"
        scored: list[Ranked] = []
        for candidate in survivors:
            step = _step(plan, results, spent_s, candidate, stage, seconds, start[candidate.label], wide=rung == 0)
            if isinstance(step, Probe):
                return step
            if isinstance(step, Decision):  # out of budget mid-rung: what this rung measured so far counts too
                partial = [_partial(results, plan.goal, c, stage) for c in survivors]
                return _decide(plan, finished + [r for r in partial if r is not None], last_rung, [], "budget")
            scored.append(step)
        finished += scored
        scored.sort(key=_rank_key, reverse=True)
        last_rung = scored
        if len(scored) <= 1:
            break
        survivors = [r.candidate for r in scored[: math.ceil(len(scored) / 2)]]
        start = {r.candidate.label: max(r.rate, MIN_RATE) if r.rate else start[r.candidate.label] for r in scored}
        seconds *= 2
        rung += 1
    winner = last_rung[0]
    samples = [winner.score]
    if winner.score <= (-math.inf if plan.goal.target_rps is not None else 0.0):
        return _decide(plan, finished, last_rung, samples, "done")  # nothing met the goal: no repeats
    for repeat in range(1, plan.repeats):
        step = _step(plan, results, spent_s, winner.candidate, f"repeat{repeat}", seconds, max(winner.rate, MIN_RATE))
        if isinstance(step, Probe):
            return step
        if isinstance(step, Decision):
            return _decide(plan, finished, last_rung, samples, "budget")
        samples.append(step.score)
    return _decide(plan, finished, last_rung, samples, "done")


def _step(
    plan: Plan,
    results: Sequence[ProbeResult],
    spent_s: float,
    candidate: Variant,
    stage: str,
    seconds: float,
    start: float,
    wide: bool = False,
) -> Probe | Decision | Ranked:
    """This candidate's stage: its next probe, its score once finished, or a (placeholder) Decision when the
    next probe would run past the budget."""
    done = _stage_results(results, candidate.label, stage)
    rate = _next_rate(done, plan.goal, start, plan.stage_steps(stage), wide)
    if rate is None:
        score, at, p95 = _score(done, plan.goal)
        return Ranked(candidate, stage, score, at, p95)
    same_server = bool(results) and results[-1].probe.candidate.label == candidate.label
    start_cost = 0.0 if same_server else _start_cost(plan, results)
    # The first probe runs whatever the budget: a search that measured nothing could not say anything.
    if results and spent_s + start_cost + probe_cost(seconds) > plan.budget_s:
        return Decision(None, None, [], False, "budget")
    return Probe(candidate, stage, round(rate, 2), seconds)


def _start_cost(plan: Plan, results: Sequence[ProbeResult]) -> float:
    """A server start: the plan's estimate, or the slowest seen so far (a probe that followed another
    candidate's paid for its server's start)."""
    starts = [
        r.wall_s - probe_cost(r.probe.seconds)
        for before, r in zip([None, *results], results, strict=False)
        if before is None or before.probe.candidate.label != r.probe.candidate.label
    ]
    return max([plan.overhead_s, *starts])


def _partial(results: Sequence[ProbeResult], goal: Goal, candidate: Variant, stage: str) -> Ranked | None:
    done = _stage_results(results, candidate.label, stage)
    if not done:
        return None
    score, at, p95 = _score(done, goal)
    return Ranked(candidate, stage, score, at, p95)


def _decide(plan: Plan, finished: list[Ranked], last_rung: list[Ranked], samples: list[float], why: str) -> Decision:
    # The ranking: each candidate's score at the furthest rung it finished.
    furthest: dict[str, Ranked] = {}
    for r in finished:
        furthest[r.candidate.label] = r  # later rungs come later in `finished`
    depth = {r.candidate.label: int(r.stage.removeprefix("rung")) for r in furthest.values()}
    ranking = sorted(furthest.values(), key=lambda r: (depth[r.candidate.label], *_rank_key(r)), reverse=True)
    meeting = [r for r in ranking if r.score > (-math.inf if plan.goal.target_rps is not None else 0.0)]
    if not meeting:
        return Decision(None, None, [], False, why, ranking)
    winner = meeting[0]
    samples = samples or [winner.score]
    # The runner-up: the best other candidate of the last rung that had two or more (scored side by side).
    rivals = [r for r in last_rung if r.candidate.label != winner.candidate.label]
    if not rivals:
        rivals = [r for r in ranking if r.candidate.label != winner.candidate.label]
    runner_up = rivals[0] if rivals else None
    # Within the spread: the runner-up did at least as well as the winner's worst sample.
    noisy = runner_up is not None and runner_up.score > -math.inf and runner_up.score >= min(samples)
    return Decision(winner, runner_up, samples, noisy, why, ranking)
