"""`twinserve k8s --results` on what `twinserve tune` wrote: the autoscaler sized on the winner's capacity at the
SLO, with bench's rule (`advise.autoscaling_targets`, `HEADROOM`). The results files here are written by tune's
own writer (`write_tune_outputs`) from made-up probes, so the format read is the one tune writes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from twinserve.cli import main
from twinserve.config import Config
from twinserve.deploy.commands import k8s_config
from twinserve.deploy.k8s import IN_FLIGHT_METRIC, MEMORY_HEADROOM, cpu_request_cores, process_counts
from twinserve.lab.advise import HEADROOM
from twinserve.lab.results import Ceiling, ProcessMemory, Resources
from twinserve.lab.tune import TuneOutcome, TuneRequest
from twinserve.lab.tune_report import write_tune_outputs
from twinserve.lab.tune_results import load_measured, probe_results
from twinserve.lab.tune_search import Decision, Goal, Probe, ProbeResult, Ranked, plan_search
from twinserve.lab.tune_space import ModelFacts, search_space
from twinserve.lab.variants import Variant

MODEL = "twinserve.examples.tabular:Classifier"
SLO = 50.0
WINNERS = {
    "sync": Variant("sync", {"workers": 2, "threads": 8, "max_batch_size": 1, "max_batch_delay_ms": 0.0}),
    "async": Variant("async", {"workers": 2, "max_batch_size": 32, "max_batch_delay_ms": 0.0}),
    "hybrid": Variant("hybrid", {"workers": 1, "model_workers": 2, "max_batch_size": 32, "max_batch_delay_ms": 1.0}),
}
#: Per process RSS the made-up probes report, by role.
SERVER_MIB, MODEL_WORKER_MIB = 100.0, 150.0


def _resources(cpu: float) -> Resources:
    per_process = [
        ProcessMemory(pid=1, role="server", rss_mib=SERVER_MIB),
        ProcessMemory(pid=2, role="server", rss_mib=SERVER_MIB),
        ProcessMemory(pid=3, role="model_worker", rss_mib=MODEL_WORKER_MIB),
    ]
    rss = sum(p.rss_mib for p in per_process)
    return Resources(
        samples=10,
        processes=3,
        rss_mib_mean=rss,
        rss_mib_max=rss,
        cpu_percent_mean=cpu,
        cpu_percent_max=cpu,
        per_process=per_process,
    )


def _probe(
    variant: Variant, stage: str, rate: float, answered: float, p95: float, mean: float, cpu: float = 100.0
) -> ProbeResult:
    return ProbeResult(
        Probe(variant, stage, rate, 2.0),
        sent=int(rate * 2),
        errors=0,
        achieved_rps=rate,
        throughput_rps=answered,
        p50_ms=mean * 0.8,
        p95_ms=p95,
        p99_ms=p95 * 1.2,
        rss_mib=_resources(cpu).rss_mib_max,
        wall_s=3.0,
        mean_ms=mean,
        resources=_resources(cpu),
    )


def write_tune(out: Path, arch: str, *, winner: bool = True) -> TuneOutcome:
    """A tune run's outputs: the winner's capacity search (100 and 200 req/s met, 400 missed) and a repeat, and a
    faster loser whose probes must not count."""
    best = WINNERS[arch]
    loser = Variant(best.arch, {**best.settings, "max_batch_delay_ms": 5.0})
    results = [
        _probe(best, "rung0", 100, 100, 10, 5, cpu=60),
        _probe(best, "rung0", 200, 199, 30, 12, cpu=150),
        _probe(best, "rung0", 400, 300, 200, 90, cpu=190),
        _probe(loser, "rung0", 500, 500, 20, 8, cpu=195),
        _probe(best, "repeat1", 200, 195, 35, 13, cpu=140),
    ]
    ceiling = [Ceiling(batch_size=b, batch_ms_median=b, instances_per_s=1000.0) for b in (1, 8, 32)]
    facts = ModelFacts(ceiling, 2)
    goal = Goal(SLO)
    ranked = Ranked(best, "rung0", 200.0, 200.0, 30.0)
    decision = (
        Decision(ranked, None, [200.0, 200.0], False, "done", [ranked])
        if winner
        else Decision(None, None, [], False, "done", [ranked])
    )
    request = TuneRequest(MODEL, goal, 60, [b"{}"], archs=(arch,))
    plan = plan_search([best, loser], {best.label: 500.0, loser.label: 500.0}, goal, budget_s=60)
    outcome = TuneOutcome(request, facts, search_space(facts), plan, decision, results, "iris", 50.0)
    machine = {"hostname": "h", "platform": "linux", "python": "3.11", "cpu_count": 2, "cpu_model": "x",
               "memory_mib": 4096.0}  # fmt: skip
    write_tune_outputs(outcome, out, machine)
    return outcome


def k8s(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["k8s", "--image", "registry.example/twinserve:0.1.0", *flags])
    captured = capsys.readouterr()
    docs = list(yaml.safe_load_all(captured.out)) if code == 0 else []
    return code, docs, captured.err


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def quantity(text: str) -> float:
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_tunes_probes_read_back_as_written(tmp_path: Path) -> None:
    """The reader and the writer agree on every field k8s uses (the format cannot drift unnoticed)."""
    outcome = write_tune(tmp_path, "hybrid")
    record = orjson.loads((tmp_path / "results.json").read_bytes())
    assert probe_results(record) == outcome.results
    measured = load_measured(tmp_path)
    assert measured.tuned_arch == "hybrid"
    (run,) = measured.results.runs
    # The winner's probes that met the SLO, none of the faster loser's.
    assert sorted(lv.rate or 0 for lv in run.levels) == [100, 200, 200]
    assert run.settings == WINNERS["hybrid"].settings


@pytest.mark.parametrize("arch", ["sync", "async", "hybrid"])
def test_the_autoscaler_is_sized_on_the_winners_capacity_at_the_slo(
    arch: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tune(tmp_path, arch)
    code, docs, err = k8s(capsys, "--results", str(tmp_path))  # the folder; arch and SLO from tune
    assert code == 0, err
    objects = kinds(docs)
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[2] == MODEL and command[command.index("--arch") + 1] == arch
    for name, value in WINNERS[arch].settings.items():
        flag = "--" + name.replace("_", "-")
        if value != Config.model_fields[name].get_default(call_default_factory=True):
            assert command[command.index(flag) + 1] == str(value)
    hpa = objects["HorizontalPodAutoscaler"]
    assert "tune winner" in hpa["metadata"]["annotations"]["twinserve.dev/target-basis"]
    (metric,) = hpa["spec"]["metrics"]
    config = k8s_config({"arch": arch, **WINNERS[arch].settings})
    # The basis: the winner's highest throughput within the SLO, 199/s at 200 req/s (P95 30 ms, mean 12 ms, CPU
    # 150% of a core); the loser's 500/s does not count, nor the winner's 400 req/s that missed.
    if arch == "sync":
        expected = round(HEADROOM * 150 / cpu_request_cores(config))
        assert metric["resource"]["target"]["averageUtilization"] == expected
    else:
        assert metric["pods"]["metric"]["name"] == IN_FLIGHT_METRIC
        in_flight = HEADROOM * 199 * 12 / 1000  # Little's law at the basis
        assert quantity(metric["pods"]["target"]["averageValue"]) == pytest.approx(in_flight, abs=1e-3)
    # Memory from the winner's measured RSS per process and role.
    servers, models = process_counts(config)
    memory = MEMORY_HEADROOM * (servers * SERVER_MIB + models * MODEL_WORKER_MIB)
    assert container["resources"]["requests"]["memory"] == f"{64 * math.ceil(memory / 64)}Mi"


def test_the_results_file_and_winner_toml_give_the_same_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tune(tmp_path, "async")
    _, from_folder, _ = k8s(capsys, "--results", str(tmp_path))
    code, with_config, err = k8s(
        capsys, "--results", str(tmp_path / "results.json"), "--config", str(tmp_path / "winner.toml")
    )
    assert code == 0 and not err, err
    assert with_config == from_folder
    code, alone, _ = k8s(capsys, "--config", str(tmp_path / "winner.toml"))  # no results: the defaults size it
    command = kinds(alone)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert (
        code == 0
        and command == kinds(from_folder)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
    )


def test_a_tighter_slo_re_judges_the_winners_probes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_tune(tmp_path, "async")
    code, docs, err = k8s(capsys, "--results", str(tmp_path), "--slo-p95-ms", "20")
    assert code == 0, err
    (metric,) = kinds(docs)["HorizontalPodAutoscaler"]["spec"]["metrics"]
    # Only 100 req/s met P95 <= 20 ms (10 ms there, mean 5 ms).
    assert quantity(metric["pods"]["target"]["averageValue"]) == pytest.approx(HEADROOM * 100 * 5 / 1000, abs=1e-3)


def test_a_tune_run_without_a_winner_or_an_slo_nothing_met_fails_loudly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tune(tmp_path, "async")
    code, _, err = k8s(capsys, "--results", str(tmp_path), "--slo-p95-ms", "1")
    assert code == 2 and "no async level" in err
    code, _, err = k8s(capsys, "--results", str(tmp_path), "--arch", "sync")
    assert code == 2 and "no sync level" in err  # tune measured async only
    none = tmp_path / "none"
    write_tune(none, "async", winner=False)
    code, _, err = k8s(capsys, "--results", str(none))
    assert code == 2 and "found no setting that met its goal" in err
