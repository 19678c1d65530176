"""The advisor on hand-made results: the numbers decide, and the explanation cites them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.lab.factory import level, results, run
from twinserve.lab.advise import advise


def test_picks_the_highest_throughput_that_meets_the_slo() -> None:
    sync = run("sync", "sync", [level(1, 500, 5), level(8, 900, 20), level(32, 950, 80)])
    asyn = run("async", "async", [level(1, 600, 4), level(8, 2500, 8), level(32, 3000, 30)], rss=400)
    advice = advise(results(sync, asyn), 50)
    assert advice.meets and advice.choice is not None
    assert advice.choice.run.label == "async" and advice.choice.level.concurrency == 32
    assert "3,000 req/s" in advice.lines[0] and "P95 30.0 ms" in advice.lines[0]
    assert any(line.startswith("- sync: 900 req/s") for line in advice.lines)  # 950 req/s broke the SLO


def test_a_tighter_slo_changes_the_answer() -> None:
    sync = run("sync", "sync", [level(1, 500, 3), level(8, 900, 6)])
    asyn = run("async", "async", [level(1, 600, 4), level(8, 2500, 8)])
    assert advise(results(sync, asyn), 7).choice.run.label == "sync"  # type: ignore[union-attr]
    assert advise(results(sync, asyn), 10).choice.run.label == "async"  # type: ignore[union-attr]


def test_levels_with_errors_never_qualify() -> None:
    sync = run("sync", "sync", [level(8, 900, 20)])
    asyn = run("async", "async", [level(8, 2500, 8, errors=3)])
    assert advise(results(sync, asyn), 50).choice.run.label == "sync"  # type: ignore[union-attr]


def test_nothing_meets_the_slo_names_the_closest() -> None:
    sync = run("sync", "sync", [level(1, 500, 120), level(8, 900, 300)])
    asyn = run("async", "async", [level(1, 600, 90), level(8, 2500, 250)])
    advice = advise(results(sync, asyn), 50)
    assert not advice.meets
    assert advice.choice is not None and advice.choice.run.label == "async"
    assert advice.lines[0].startswith("Nothing meets P95 <= 50 ms") and "P95 90.0 ms" in advice.lines[0]


def test_a_tie_is_broken_by_memory() -> None:
    heavy = run("async workers=2", "async", [level(8, 3000, 10, rss=800)], workers=2)
    light = run("async workers=1", "async", [level(8, 2900, 10, rss=300)], workers=1)  # within 5%: a tie
    advice = advise(results(heavy, light), 50)
    assert advice.choice is not None and advice.choice.run.label == "async workers=1"
    assert "--workers 1" in advice.lines[0]
    assert "least memory" in advice.lines[1]
    clear_winner = run("async workers=2", "async", [level(8, 4000, 10, rss=800)], workers=2)
    assert advise(results(clear_winner, light), 50).choice.run.label == "async workers=2"  # type: ignore[union-attr]


def test_target_throughput_and_memory_cap() -> None:
    sync = run("sync", "sync", [level(8, 900, 20, rss=200)])
    asyn = run("async", "async", [level(8, 2500, 8, rss=600)])
    assert advise(results(sync, asyn), 50, max_memory_mib=300).choice.run.label == "sync"  # type: ignore[union-attr]
    advice = advise(results(sync, asyn), 50, target_rps=3000)
    assert not advice.meets and advice.lines[0].startswith("Nothing meets P95 <= 50 ms, >= 3000 req/s")
    assert advice.choice is not None and advice.choice.run.label == "async"


def test_the_advise_command_reads_a_results_file(tmp_path: Path) -> None:
    sync = run("sync", "sync", [level(8, 900, 20)])
    asyn = run("async", "async", [level(8, 2500, 8)])
    (tmp_path / "results.json").write_text(results(sync, asyn, slo=50).model_dump_json())
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", "advise", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert "Advice for P95 <= 50 ms" in done.stdout and "Run async" in done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 99}')
    done = subprocess.run([sys.executable, "-m", "twinserve", "advise", str(bad)], capture_output=True, text=True)
    assert done.returncode != 0 and "schema_version 1" in done.stderr
