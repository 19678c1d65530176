"""The advisor on hand-made results: the numbers decide, and the explanation cites them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.factory import level, results, run
from twinserve.lab.advise import advise
from twinserve.lab.results import Ceiling, Level, ServerStats


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


def test_the_pick_comes_with_its_serve_command_and_each_other_option_with_why_not() -> None:
    """issue #55: the advice names the command that runs its pick, and one reason for each option left out."""
    heavy = run("async workers=2", "async", [level(8, 3000, 10, rss=800)], workers=2)
    light = run("async workers=1", "async", [level(8, 2900, 10, rss=300)], workers=1)
    slow = run("sync", "sync", [level(8, 900, 20, rss=200)])
    late = run("hybrid", "hybrid", [level(8, 2000, 90)])
    advice = advise(results(heavy, light, slow, late), 50)
    assert advice.choice is not None and advice.choice.run is light
    served = results(heavy).model
    assert f"Serve it: twinserve serve {served} --arch async --workers 1" in advice.lines
    assert "- async workers=2: 3,000 req/s" in next(line for line in advice.lines if line.startswith("- async w"))
    assert next(line for line in advice.lines if line.startswith("- async w")).endswith("but more memory.")
    assert next(line for line in advice.lines if line.startswith("- sync:")).endswith(
        "69% less throughput than async workers=1."
    )
    assert "- hybrid: never met P95 <= 50 ms without errors." in advice.lines
    capped = advise(results(heavy, slow), 50, max_memory_mib=300)
    assert next(line for line in capped.lines if line.startswith("- async")).endswith("over the 300 MiB memory cap.")


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


def _with_stats(lv: Level, batch: float, inference_ms: float) -> Level:
    return lv.model_copy(
        update={
            "server": ServerStats(
                requests=1, batches=1, batch_size_mean=batch, queue_wait_ms_mean=1.0, inference_ms_mean=inference_ms
            )
        }
    )


def test_hybrid_trailing_async_by_more_than_a_tenth_is_explained_from_the_measurements() -> None:
    """Issue #15: hybrid within 10% of async, or advise says why, from what was measured at one load: P95, CPU per
    request, time per batch as each server timed it against the model alone in-process."""
    asyn = run("async", "async", [_with_stats(level(32, 3000, 10, cpu=150), 16, 3.2)])
    hybrid = run("hybrid", "hybrid", [_with_stats(level(32, 2000, 12, cpu=180), 16, 5.0)])
    measured = results(asyn, hybrid).model_copy(
        update={
            "ceiling": [
                Ceiling(batch_size=1, batch_ms_median=1.0, instances_per_s=1000),
                Ceiling(batch_size=32, batch_ms_median=3.0, instances_per_s=10_667),
            ]
        }
    )
    lines = advise(measured, 50).lines
    why = lines.index(next(line for line in lines if line.startswith("Why hybrid trails async")))
    assert (
        "(2,000 against 3,000 req/s within the objective, 33% less), at the same load (32 connections):" in (lines[why])
    )
    assert lines[why + 1] == "  P95 12.0 ms in hybrid, 10.0 ms in async; 2,000 and 3,000 req/s."
    # 180% of a core over 2,000 req/s, 150% over 3,000: the hop's CPU.
    assert lines[why + 2].startswith("  CPU per request (the process tree's CPU over its throughput): 900 µs in hybrid")
    assert "500 µs in async (+400 µs): the hop to a model-worker process" in lines[why + 2]
    # In-process, 16 rows: between 1.0 ms (1) and 3.0 ms (32).
    assert "5.00 ms for 16.0 rows in hybrid (0.312 ms a row), 3.20 ms for 16.0 in async" in lines[why + 3]
    assert "the model alone in-process, on every core: 1.97 ms for 16.0" in lines[why + 3]


def test_hybrid_slower_at_no_more_cpu_is_said_to_wait_not_work() -> None:
    asyn = run("async", "async", [level(16, 500, 36, cpu=195), level(64, 680, 109, cpu=195)])
    hybrid = run("hybrid", "hybrid", [level(16, 300, 56, cpu=100), level(64, 650, 105, cpu=190)])
    lines = advise(results(asyn, hybrid), 60).lines  # hybrid's best within 60 ms: 16 connections
    why = lines.index(next(line for line in lines if line.startswith("Why hybrid")))
    assert "at the same load (16 connections)" in lines[why]
    assert "P95 56.0 ms in hybrid, 36.0 ms in async" in lines[why + 1]
    assert "no more CPU on a request: it waits" in lines[why + 2]


def test_hybrid_within_a_tenth_of_async_or_not_measured_needs_no_explanation() -> None:
    asyn = run("async", "async", [level(32, 3000, 10)])
    close = run("hybrid", "hybrid", [level(32, 2750, 10)])
    slow_but_late = run("hybrid", "hybrid", [level(32, 2000, 80)])  # never met the SLO: nothing to compare
    for hybrid in (close, slow_but_late):
        assert not any(line.startswith("Why hybrid") for line in advise(results(asyn, hybrid), 50).lines)
    bare = run("hybrid", "hybrid", [level(32, 2000, 10).model_copy(update={"resources": None})])
    lines = advise(results(asyn, bare), 50).lines  # no CPU, no server metrics: the verdict alone, no figures made up
    assert sum(line.startswith("Why hybrid") for line in lines) == 1
    assert not any("CPU per request" in line or "Per batch" in line for line in lines)


def test_the_in_process_ceiling_counts_the_processes_the_cores_hold() -> None:
    """The efficiency line's ceiling is the machine's: a single-threaded model's rate once per core; a model on
    both cores once, or twice under a one-thread cap when that computes more (MiniLM: 2 x 432 > 717)."""
    asyn = run("async", "async", [level(32, 432, 10)])

    def line(*rows: tuple[int | None, float, float]) -> str:
        ceiling = [
            Ceiling(batch_size=32, batch_ms_median=32_000 / rate, instances_per_s=rate, cores=cores, threads=t)
            for t, rate, cores in rows
        ]
        return advise(results(asyn).model_copy(update={"ceiling": ceiling}), 50).lines[0]

    assert "50% of the model's in-process ceiling on 2 core(s) (864 instances/s: 2 process(es) at batch 32, 1 math" in (
        line((2, 717, 1.96), (1, 432, 1.0))
    )
    assert "60% of the model's in-process ceiling on 2 core(s) (717 instances/s: 1 process(es) at batch 32, 2 math" in (
        line((2, 717, 1.96), (1, 300, 1.0))
    )
    assert "(864 instances/s: 2 process(es) at batch 32)." in line((None, 432, 1.0))  # the libraries' own threads
    assert "(864 instances/s: 2 process(es) at batch 32)." in line((2, 432, 1.0))  # one core busy: measured once
