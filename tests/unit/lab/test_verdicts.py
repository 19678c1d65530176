"""The article's claims judged on hand-made results: a verdict says "can't tell" where the runs cannot answer."""

from __future__ import annotations

from tests.factory import level, results, run
from twinserve.lab.results import Run, Verdict
from twinserve.lab.verdicts import verdicts


def s21(*runs: Run) -> Verdict:
    return next(v for v in verdicts(results(*runs)) if v.source == "S21")


SYNC_SATURATES = run("sync", "sync", [level(1, 500, 5), level(4, 900, 10), level(16, 920, 40)])


def test_s21_cannot_tell_while_an_architecture_never_saturated() -> None:
    """Before: "holds" although async's throughput still grew at the highest load measured."""
    growing = run("async", "async", [level(1, 400, 5), level(4, 1200, 8), level(16, 3000, 12)])
    verdict = s21(SYNC_SATURATES, growing)
    assert verdict.holds is None
    # Its mark says "can't tell" (holds is None): the evidence no longer repeats it ("can't tell — can't tell: ...").
    assert verdict.evidence.startswith("async did not saturate within the run")
    assert "sync saturates from 4 connections" in verdict.evidence


def test_s21_cannot_tell_from_one_load_level() -> None:
    verdict = s21(SYNC_SATURATES, run("async", "async", [level(8, 2000, 9)]))
    assert verdict.holds is None and "async was measured at one load only" in verdict.evidence


def test_s21_holds_once_every_architecture_saturated_at_its_own_point() -> None:
    asyn = run("async", "async", [level(1, 400, 5), level(4, 1200, 8), level(16, 3000, 12), level(64, 3050, 50)])
    verdict = s21(SYNC_SATURATES, asyn)
    assert verdict.holds is True
    assert "sync saturates from 4 connections" in verdict.evidence
    assert "async saturates from 16 connections" in verdict.evidence


def test_s21_does_not_hold_when_every_architecture_saturated_at_the_same_point() -> None:
    same = run("async", "async", [level(1, 510, 5), level(4, 910, 10), level(16, 930, 40)])
    assert s21(SYNC_SATURATES, same).holds is False


def test_s21_without_runs_cannot_tell() -> None:
    verdict = next(v for v in verdicts(results()) if v.source == "S21")
    assert verdict.holds is None and verdict.evidence == "no runs"
