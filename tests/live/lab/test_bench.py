"""`twinserve bench` end to end: real servers, real load, a results file whose numbers add up."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from tests.live.lab.browser import chromium
from tests.serving import model_path
from twinserve.lab.advise import TIE, advise
from twinserve.lab.results import Results, load_results

TABULAR = "twinserve.examples.tabular:Classifier"


def bench(tmp_path: Path, *args: str, model: str = TABULAR) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", "bench", model, "--out", str(out), "--warmup", "0.5", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, out


def check_counts(results: Results) -> None:
    for run in results.runs:
        for level in run.levels:
            assert level.sent == level.ok + sum(level.http_errors.values()) + sum(level.transport_errors.values())
            assert level.ok > 0 and level.throughput_rps > 0
            assert level.latency_ms["p50"] is not None
            assert level.latency_ms["p50"] <= level.latency_ms["p95"] <= level.latency_ms["p99"]  # type: ignore[operator]


@pytest.fixture(scope="module")
def two_archs(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    return bench(
        tmp_path_factory.mktemp("bench"),
        "--arch", "sync,async",
        "--concurrency", "1,4",
        "--rate", "40",
        "--duration", "1.5",
        "--ceiling-sizes", "1,4",
        "--slo-p95-ms", "250",
    )  # fmt: skip


def test_bench_off_a_terminal_prints_one_plain_line_per_step(
    two_archs: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """In a log or CI job the progress is plain lines, not a bar redrawn with escape codes."""
    done, _ = two_archs
    steps = [line for line in done.stdout.splitlines() if line.startswith("- ")]
    assert steps[:5] == [
        "- sync: starting",
        "- sync: idle memory (0.5 s)",
        "- sync: measuring 1 conn (1.5 s after a 0.5 s warm-up)",
        "- sync: measuring 4 conns (1.5 s after a 0.5 s warm-up)",
        "- sync: measuring 40 req/s (1.5 s after a 0.5 s warm-up)",
    ]
    assert "- async: measuring 40 req/s (1.5 s after a 0.5 s warm-up)" in steps
    assert "- in-process: measuring (4 s)" in steps
    assert "\x1b[" not in done.stdout


def test_bench_writes_a_results_file_whose_counts_add_up(
    two_archs: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = two_archs
    assert done.returncode == 0, done.stdout + done.stderr
    results = load_results(out / "results.json")
    assert [r.arch for r in results.runs] == ["sync", "async"]
    assert results.model_name == "iris" and results.machine.cpu_count >= 1 and "uvicorn" in results.versions
    check_counts(results)
    for run in results.runs:
        assert run.error is None and run.startup_s is not None
        assert run.command[:4] == ["twinserve", "serve", TABULAR, "--arch"]
        assert [(lv.mode, lv.load) for lv in run.levels] == [("closed", 1), ("closed", 4), ("open", 40)]
        assert run.idle is not None and run.idle.rss_mib_max > 0
        for level in run.levels:
            assert level.driver == "twinserve" and level.errors == 0
            assert level.resources is not None and level.resources.samples > 0 and level.resources.rss_mib_max > 0
            assert level.server is not None  # the server's own /metrics, before and after
            assert level.server.requests >= level.ok  # the server also answered the warm-up
            assert level.server.batch_size_mean is not None and level.server.batch_size_mean >= 1
    assert [c.batch_size for c in results.ceiling] == [1, 4]
    assert all(c.instances_per_s > 0 for c in results.ceiling)
    assert {v.source for v in results.verdicts} >= {"S20", "S21", "S12", "S22"}
    assert all(v.evidence for v in results.verdicts)
    assert (out / "report.html").stat().st_size > 0
    assert list((out / "plots").glob("*.png"))
    assert "The claims of the article" in done.stdout and "Advice for P95 <= 250 ms" in done.stdout


def test_advise_picks_what_the_numbers_in_the_file_say(
    two_archs: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = two_archs
    results = load_results(out / "results.json")
    slo = 250.0
    best = {}
    for run in results.runs:
        within = [lv for lv in run.levels if lv.errors == 0 and (lv.p("p95") or 1e9) <= slo]
        if within:
            best[run.label] = max(within, key=lambda lv: lv.throughput_rps)
    top = max(lv.throughput_rps for lv in best.values())
    tied = {label for label, lv in best.items() if lv.throughput_rps >= top * (1 - TIE)}
    expected = min(tied, key=lambda label: best[label].resources.memory_mib)  # type: ignore[union-attr]
    advice = advise(results, slo)
    assert advice.meets and advice.choice is not None and advice.choice.run.label == expected
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", "advise", str(out / "results.json"), "--slo-p95-ms", str(slo)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"Run {advice.choice.run.arch}" in done.stdout


@pytest.mark.parametrize("driver", ["wrk", "locust"])
def test_other_drivers_report_into_the_same_schema(tmp_path: Path, driver: str) -> None:
    done, out = bench(
        tmp_path, "--arch", "async", "--concurrency", "4", "--duration", "2", "--driver", driver, "--ceiling-sizes", "1"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = load_results(out / "results.json")
    check_counts(results)
    (level,) = results.runs[0].levels
    assert level.driver == driver and level.errors == 0 and level.concurrency == 4


def test_a_server_that_cannot_start_is_reported_not_fatal(tmp_path: Path) -> None:
    done, out = bench(
        tmp_path, "--arch", "async,sync", "--concurrency", "1", "--duration", "1", model=model_path("FailsToLoad")
    )
    assert done.returncode == 1
    results = load_results(out / "results.json")
    assert all(run.error is not None and "exited" in run.error for run in results.runs)
    assert "model load failed on purpose" in results.runs[0].error  # type: ignore[operator]
    assert (out / "report.html").exists()


def test_the_bench_report_renders_in_chromium(
    two_archs: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    _, out = two_archs
    page = (out / "report.html").resolve().as_uri()
    dom = chromium(tmp_path, "--dump-dom", page)
    assert re.findall(r'data-plot="(\w+)"', dom) == ["throughput", "latency", "memory", "cpu", "errors"]
    levels = sum(len(run.levels) for run in load_results(out / "results.json").runs)
    assert dom.count('class="point"') == levels * 7  # latency plots p50, p95 and p99 per level
    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,3000", page)
    assert imread(shot).std() > 0


def test_a_user_model_file_with_a_payload_file(tmp_path: Path) -> None:
    payload = tmp_path / "bodies.jsonl"
    payload.write_text('{"instances": [1, 2, 3]}\n\n{"instances": ["a"]}\n')
    done, out = bench(
        tmp_path, "--arch", "async", "--concurrency", "2", "--duration", "1", "--payload", str(payload),
        "--ceiling-sizes", "1,2", model=model_path("Echo"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = load_results(out / "results.json")
    check_counts(results)
    assert results.payload == str(payload) and results.instances_per_request == 2.0
    assert [c.batch_size for c in results.ceiling] == [1, 2]


def test_a_model_without_examples_needs_a_payload(tmp_path: Path) -> None:
    done, out = bench(tmp_path, "--arch", "async", "--concurrency", "1", "--duration", "1", model=model_path("Echo"))
    assert done.returncode == 1
    assert "--payload" in (load_results(out / "results.json").runs[0].error or "")


def test_locustfile_writes_a_runnable_locust_file(tmp_path: Path) -> None:
    target = tmp_path / "locustfile.py"
    subprocess.run(
        [sys.executable, "-m", "twinserve", "locustfile", "-o", str(target)], check=True, capture_output=True
    )
    source = target.read_text()
    compile(source, str(target), "exec")
    assert "class PredictUser(FastHttpUser)" in source and "'/v1/models/iris:predict'" in source
    assert source.count('"instances"') == 3  # one body per example of the iris model
