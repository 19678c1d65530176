"""What `twinserve tune` says, on made-up probes: the winner's capacity and its basis, every other candidate against
the winner's load ("clearly behind" only where it failed there), repeats as run, candidates as measured, and
probe errors by kind. No server: the summary is a pure function of the plan, the probes and the decision."""

from __future__ import annotations

from twinserve.lab.tune.search import Decision, Goal, Plan, Probe, ProbeResult, Ranked, meets
from twinserve.lab.tune.summary import capacity, summarize
from twinserve.lab.variants import Variant

SLO = 50.0
GOAL = Goal(SLO)
WINNER = Variant("async", {"workers": 2, "max_batch_size": 32})
RUNNER = Variant("async", {"workers": 1, "max_batch_size": 32})
OTHERS = [Variant("sync", {"workers": w, "threads": 8}) for w in (1, 2, 3, 4, 5, 6, 7, 8)]
CANDIDATES = [WINNER, RUNNER, *OTHERS]  # 10, most promising first


def probe(
    variant: Variant,
    stage: str,
    rate: float,
    p95: float,
    *,
    errors: int = 0,
    kinds: dict[str, int] | None = None,
) -> ProbeResult:
    """A probe that answered what it was sent, at `p95` (it misses past the SLO)."""
    return ProbeResult(
        Probe(variant, stage, rate, 2.0),
        sent=int(2 * rate),
        errors=errors,
        achieved_rps=rate,
        throughput_rps=rate * 0.99,
        p50_ms=p95 / 2,
        p95_ms=p95,
        p99_ms=p95 * 1.2,
        memory_mib=300.0,
        wall_s=3.0,
        mean_ms=p95 / 3,
        error_kinds=kinds or {},
    )


def plan(goal: Goal = GOAL, n0: int = 0, repeats: int = 3) -> Plan:
    return Plan(CANDIDATES, {v.label: 5000.0 for v in CANDIDATES}, goal, 300.0, repeats, 2.0, n0)


def decision(stage: str, rate: float, runner: Ranked | None, stopped: str = "done") -> Decision:
    winner = Ranked(WINNER, stage, rate, rate, 40.0)
    return Decision(winner, runner, [rate], False, stopped, [winner] + ([runner] if runner else []))


def winner_probes() -> list[ProbeResult]:
    """The user's run (issue #43): a lucky 5,187 at rung 0; 5,151 missed at rung 1 (P95 721 ms) and met on the
    repeat; the budget ran out before the second repeat."""
    return [
        probe(WINNER, "rung0", 2500, 10),
        probe(WINNER, "rung0", 5187, 45),
        probe(WINNER, "rung1", 5187, 300),
        probe(WINNER, "rung1", 3963, 41.2),
        probe(WINNER, "rung1", 5151, 721),
        probe(WINNER, "repeat1", 3963, 38.0),
        probe(WINNER, "repeat1", 5151, 48.0),
    ]


def test_the_capacity_is_the_highest_rate_met_in_the_final_measurements_with_no_miss_at_or_below_it() -> None:
    results = winner_probes()
    found = capacity(results, WINNER.label, "rung1", GOAL, asked=3)
    assert found is not None
    # Not 5,187 (met once, at rung 0: not a final measurement) nor 5,151 (missed at rung 1, met on its repeat).
    assert found.rate == 3963
    assert found.measurements == ("rung1", "repeat1") and found.met_in == 2 and found.asked == 3
    # Of the two probes at 3,963 the basis is the one with the higher P95: the figure never flatters.
    assert found.basis.p95_ms == 41.2 and found.number == 4
    assert found.basis_text().startswith(
        "met P95 <= 50 ms at 3,963 req/s or above in 2 of 2 measurements (rung1, repeat1), with no miss at or below it"
    )
    record = found.to_dict()
    assert (record["rate_rps"], record["p95_ms"], record["met_in"], record["asked"]) == (3963, 41.2, 2, 3)


def test_a_measurement_that_never_got_that_low_leaves_the_rate_met_in_fewer() -> None:
    """At a tighter SLO (k8s --slo-p95-ms) a repeat that probed only above a rate says nothing against it."""
    results = [probe(WINNER, "rung1", 3963, 41.2), probe(WINNER, "rung1", 5151, 60), probe(WINNER, "repeat1", 5151, 48)]
    at_50 = capacity(results, WINNER.label, "rung1", GOAL, asked=2)
    # 5,151 missed once: not a capacity; repeat1, which met it, met 3,963 or above.
    assert at_50 is not None and (at_50.rate, at_50.met_in) == (3963, 2)
    at_45 = capacity(results, WINNER.label, "rung1", Goal(45.0), asked=2)
    assert at_45 is not None and (at_45.rate, at_45.met_in, at_45.measurements) == (3963, 1, ("rung1", "repeat1"))
    assert "in 1 of 2 measurements" in at_45.basis_text()
    # A rate met once and missed once is no capacity.
    assert capacity(results, WINNER.label, "rung1", Goal(40.0), asked=2) is None


def test_a_winner_that_missed_its_target_in_a_repeat_has_no_capacity() -> None:
    goal = Goal(SLO, target_rps=150)
    results = [probe(WINNER, "rung0", 150, 10), probe(WINNER, "repeat1", 150, 80), probe(WINNER, "repeat2", 150, 12)]
    assert capacity(results, WINNER.label, "rung0", goal, asked=3) is None
    summary = summarize(plan(goal), results, decision("rung0", -10.0, None))
    assert summary.capacity is None and summary.no_capacity is not None
    assert "missed the goal at 150 req/s (repeat1, p95 80.0 ms > 50)" in summary.no_capacity
    assert summary.lines[0].startswith(f"Winner: {WINNER.label}, with no capacity to state:")


def test_a_runner_up_never_probed_near_the_winners_load_is_not_searched_there() -> None:
    """Before: "Clear: the runner-up ... is outside the winner's spread", of a candidate never probed above 1,821."""
    results = [probe(RUNNER, "rung0", 900, 8), probe(RUNNER, "rung0", 1821, 12), *winner_probes()]
    runner = Ranked(RUNNER, "rung0", 1821, 1821, 12)
    summary = summarize(plan(n0=4), results, decision("rung1", 3963, runner, stopped="budget"), pruned=2)
    text = "\n".join(summary.lines)
    assert "Clear" not in text and "clearly behind" not in text and "outside the winner's spread" not in text
    assert summary.lines[0] == (
        f"Winner: {WINNER.label}: capacity 3,963 req/s within P95 <= 50 ms (P95 41.2 ms there, 3,923/s answered), "
        "met in 2 of 2 measurements with no miss at or below it."
    )
    assert summary.lines[1] == "Repeated 2 of 3 times (the budget ran out): rung1 3,963, repeat1 5,151 req/s."
    assert summary.repeated == 2
    assert summary.lines[2] == (
        f"Runner-up {RUNNER.label}: not searched at the winner's load (3,963 req/s): at its highest rate probed it "
        "met the goal at 1,821 req/s (rung0, P95 12.0 ms)."
    )
    # 2 of 10 measured: 6 never made the plan's rung 0, 2 of its 4 the budget did not reach.
    assert (
        "2 of 10 candidates measured (2 more pruned before the search); 6 not probed as the budget's plan fit 4 at "
        "rung 0, the most promising by prior first; 2 not reached before the budget ran out." in summary.lines
    )
    assert summary.measured == 2
    unprobed = next(s for s in summary.standings if s.candidate == OTHERS[-1])
    assert unprobed.kind == "not_searched" and "never probed" in unprobed.text and "fit 4 of 10" in unprobed.text


def test_clearly_behind_only_for_a_candidate_that_failed_at_the_winners_load_or_below() -> None:
    results = [
        probe(RUNNER, "rung1", 1800, 20),
        probe(RUNNER, "rung1", 3000, 120),  # missed below the winner's capacity: behind
        probe(OTHERS[0], "rung0", 8000, 400),  # missed only far above it: no evidence at the winner's load
        probe(OTHERS[1], "rung0", 4200, 45),  # met above it: the winner has not shown it is better
        *winner_probes(),
    ]
    runner = Ranked(RUNNER, "rung1", 1800, 1800, 20)
    summary = summarize(plan(), results, decision("rung1", 3963, runner))
    standing = {s.candidate.label: s for s in summary.standings}
    behind = standing[RUNNER.label]
    assert behind.kind == "behind" and behind.lowest_missed is not None and behind.lowest_missed.probe.rate == 3000
    assert summary.lines[2] == (
        f"Runner-up {RUNNER.label}: clearly behind: missed the goal at 3,000 req/s (rung1, p95 120.0 ms > 50), at or "
        "below the winner's 3,963 req/s."
    )
    above = standing[OTHERS[0].label]
    assert above.kind == "not_searched"
    assert "missed the goal at 8,000 req/s (rung0, p95 400.0 ms > 50)" in above.text
    close = standing[OTHERS[1].label]
    assert close.kind == "close" and close.text == (
        "too close to call: met the goal at 4,200 req/s (rung0, P95 45.0 ms), at or above the winner's 3,963 req/s"
    )
    assert standing[WINNER.label].kind == "winner"


def test_with_a_target_rate_a_slower_candidate_is_not_called_beaten() -> None:
    goal = Goal(SLO, target_rps=150)
    results = [
        probe(WINNER, "rung0", 150, 10.0),
        probe(RUNNER, "rung0", 150, 24.0),
        probe(OTHERS[0], "rung0", 150, 10.2),
        probe(OTHERS[1], "rung0", 150, 90.0),
        probe(WINNER, "repeat1", 150, 10.5),
        probe(WINNER, "repeat2", 150, 10.1),
    ]
    runner = Ranked(RUNNER, "rung0", -24.0, 150, 24.0)
    summary = summarize(plan(goal), results, decision("rung0", -10.0, runner))
    assert summary.capacity is not None and summary.capacity.rate == 150 and summary.capacity.basis.p95_ms == 10.5
    assert summary.lines[0] == (
        f"Winner: {WINNER.label}: P95 up to 10.5 ms at 150 req/s, met in 3 of 3 measurements; goal P95 <= 50 ms."
    )
    assert summary.lines[1] == "Repeated 3 of 3 times: rung0 10.0, repeat1 10.5, repeat2 10.1 ms P95."
    standing = {s.candidate.label: s for s in summary.standings}
    assert standing[RUNNER.label].kind == "slower"
    assert standing[RUNNER.label].text == (
        "slower: met the goal at 150 req/s too, at P95 24.0 ms (rung0) against the winner's 10.0-10.5 ms"
    )
    assert standing[OTHERS[0].label].kind == "close"
    assert standing[OTHERS[1].label].kind == "behind"


def test_probe_errors_are_told_by_kind() -> None:
    failed = probe(RUNNER, "rung0", 2000, 30, errors=1704, kinds={"timeout": 4, "503 queue_full": 1700})
    assert meets(failed, GOAL) == (False, "1,704 errors (503 queue_full 1,700, timeout 4)")
    results = [failed, *winner_probes()]
    summary = summarize(plan(), results, decision("rung1", 3963, Ranked(RUNNER, "rung0", 0, 0, 30)))
    assert summary.lines[2] == (
        f"Runner-up {RUNNER.label}: clearly behind: missed the goal at 2,000 req/s (rung0, 1,704 errors "
        "(503 queue_full 1,700, timeout 4)), at or below the winner's 3,963 req/s."
    )


def test_a_server_that_did_not_start_is_behind_at_any_load() -> None:
    dead = ProbeResult(
        Probe(RUNNER, "rung0", 9000, 2.0), 0, 0, 0.0, 0.0, None, None, None, 0.0, 1.0, "the server exited with code 1"
    )
    summary = summarize(plan(), [dead, *winner_probes()], decision("rung1", 3963, None))
    (standing,) = [s for s in summary.standings if s.candidate == RUNNER]
    assert standing.kind == "behind" and "its server did not start (rung0: the server exited with code 1)" in (
        standing.text
    )


def test_no_winner_says_what_each_candidate_was_measured_at() -> None:
    results = [probe(WINNER, "rung0", 100, 80), probe(WINNER, "rung0", 50, 60), probe(RUNNER, "rung0", 100, 90)]
    lost = Decision(None, None, [], False, "done", [Ranked(WINNER, "rung0", 0.0, 0.0, 60)])
    summary = summarize(plan(n0=2), results, lost)
    assert summary.capacity is None
    assert summary.lines[:2] == [
        "No setting met P95 <= 50 ms.",
        f"Closest: {WINNER.label}: it missed the goal at 50 req/s (rung0, p95 60.0 ms > 50).",
    ]
    (mine,) = [s for s in summary.standings if s.candidate == WINNER]
    assert mine.kind == "missed" and mine.text == "missed the goal at 50 req/s (rung0, p95 60.0 ms > 50)"


def test_a_winner_the_budget_left_unrepeated_says_so() -> None:
    results = [probe(WINNER, "rung0", 1000, 10), probe(WINNER, "rung0", 2000, 30), probe(WINNER, "rung0", 4000, 90)]
    summary = summarize(plan(), results, decision("rung0", 2000, None, stopped="budget"))
    assert summary.capacity is not None and (summary.capacity.rate, summary.capacity.met_in) == (2000, 1)
    assert summary.lines[1] == "Not repeated: measured 1 of 3 times (the budget ran out): rung0 2,000 req/s."
    assert summarize(plan(repeats=1), results, decision("rung0", 2000, None)).lines[1] == (
        "Measured once, as asked (--repeats 1): rung0 2,000 req/s."
    )
