"""`twinserve tune` on a model with per-model settings of its own (a `settings` class attribute, a repository's
`[settings]`): its settings start the search, each candidate's model-level knobs reach it through a scratch
repository (they would lose to its own settings as flags), and the winner's knobs are written as a `[settings]`
table beside winner.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import orjson
import pytest

from tests.serving import HTTP
from twinserve.config import load_config
from twinserve.lab.results import Ceiling
from twinserve.lab.tune.report import write_tune_outputs
from twinserve.lab.tune.results import load_measured
from twinserve.lab.tune.runner import ProbeServers, TuneOutcome, TuneRequest, measure_probe
from twinserve.lab.tune.search import Decision, Goal, Probe, Ranked, meets, plan_search
from twinserve.lab.tune.space import ModelFacts, search_space
from twinserve.lab.tune.subject import TuneSubject, probe_args, subject
from twinserve.lab.variants import Variant
from twinserve.repository.layout import read_model

ARCHS = ("sync", "async", "hybrid")
MODEL_PY = """
from helper_{n} import OFFSET


class Adder:
    settings = {{"max_batch_size": 2, "cache_size": 8}}

    def predict(self, batch):
        return [x + OFFSET for x in batch]

    def examples(self):
        return [1, 2, 3]
"""


def make_repository(root: Path) -> Path:
    """models/adder: versions 1 and 2 (each with a helper module beside it), the latest served, its own
    [settings] over its class's."""
    model = root / "models" / "adder"
    for n in (1, 2):
        (model / str(n)).mkdir(parents=True)
        (model / str(n) / "model.py").write_text(MODEL_PY.format(n=n))
        (model / str(n) / f"helper_{n}.py").write_text(f"OFFSET = {100 * n}\n")
    (model / "twinserve.toml").write_text(
        'model = "model.py:Adder"\nversions = {latest = 1}\n\n[settings]\nmax_batch_size = 4\ntimeout_ms = 5000\n'
    )
    return root / "models"


def _facts(cpus: int = 2) -> ModelFacts:
    ceiling = [Ceiling(batch_size=b, batch_ms_median=b, instances_per_s=1000.0 * b) for b in (1, 8, 32)]
    return ModelFacts(ceiling, cpus)


# -- the search starts from the model's own settings ---------------------------------------------------------
def test_the_models_own_settings_are_the_first_candidates() -> None:
    own = {"max_batch_size": 8, "max_batch_delay_ms": 2.0, "timeout_ms": 500}
    space = search_space(_facts(), own=own)
    first = space.candidates[:3]
    assert [v.arch for v in first] == list(ARCHS)
    for v in first:
        assert (v.settings["max_batch_size"], v.settings["max_batch_delay_ms"]) == (8, 2.0)
        assert "timeout_ms" not in v.settings  # not a knob: the model keeps it, in every candidate's [settings]
    assert first[0].settings["workers"] == 2 and first[0].settings["threads"] >= 8  # sync fills a batch of 8
    assert first[2].settings == {"workers": 1, "model_workers": 2, "max_batch_size": 8, "max_batch_delay_ms": 2.0}
    assert len({v.label for v in space.candidates}) == len(space.candidates)
    assert any("own settings first" in note for note in space.notes)
    # Without settings of its own, nothing changes.
    assert search_space(_facts()).candidates == search_space(_facts(), own=None).candidates


def test_hybrid_is_left_out_when_the_model_asks_for_threads() -> None:
    space = search_space(_facts(), own={"executor": "thread", "model_workers": 3})
    assert not any(v.arch == "hybrid" for v in space.candidates)
    assert any(p.label == "hybrid" and "'thread'" in p.reason for p in space.pruned)
    assert space.candidates[0].settings["executor"] == "thread" and space.candidates[0].settings["model_workers"] == 3


# -- which model, and how a candidate reaches it -------------------------------------------------------------
def test_a_repository_model_is_probed_from_a_scratch_repository(tmp_path: Path) -> None:
    repository = make_repository(tmp_path)
    tuned = subject(None, repository, "adder")
    assert tuned.per_model and tuned.name == "adder" and tuned.repository == repository.resolve()
    # The repository's [settings] over the class's; the default version's examples.
    assert tuned.settings == {"max_batch_size": 4, "cache_size": 8, "timeout_ms": 5000}
    assert [orjson.loads(b) for b in tuned.bodies] == [{"instances": [x]} for x in (1, 2, 3)]
    candidate = Variant("async", {"workers": 2, "max_batch_size": 32, "max_batch_delay_ms": 1.0})
    models, flags = probe_args(tuned, candidate, tmp_path / "scratch")
    assert models == [] and flags[0] == "--model-repository" and flags[2:] == ["--workers", "2"]
    folder = read_model(Path(flags[1]) / "adder")
    assert folder.error is None
    assert folder.settings == {"max_batch_size": 32, "cache_size": 8, "timeout_ms": 5000, "max_batch_delay_ms": 1.0}
    (version,) = folder.versions  # the user's policy: the latest only
    assert version.version == 2 and version.folder.resolve() == (repository / "adder" / "2").resolve()
    # The same settings, the same scratch repository (a capacity search restarts no copy).
    assert probe_args(tuned, candidate, tmp_path / "scratch") == (models, flags)


def test_a_model_with_a_settings_attribute_is_probed_through_a_one_line_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tunable_models.py").write_text(
        MODEL_PY.format(n=9).replace("from helper_9 import OFFSET", "OFFSET = 1")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    tuned = subject("tunable_models:Adder")
    assert tuned.settings == {"max_batch_size": 2, "cache_size": 8} and tuned.repository is None
    models, flags = probe_args(tuned, Variant("sync", {"workers": 1, "threads": 4, "max_batch_size": 4}), tmp_path)
    folder = read_model(Path(flags[1]) / "adder")
    assert models == [] and folder.error is None and folder.settings["max_batch_size"] == 4
    assert (folder.folder / "model.py").read_text() == "from tunable_models import Adder\n"
    # A plain model (no settings of its own): MODEL and every knob as flags, as before.
    plain = subject("twinserve.examples.tabular:Classifier")
    assert not plain.per_model
    variant = Variant("async", {"workers": 1, "max_batch_size": 8})
    assert probe_args(plain, variant, tmp_path) == (
        ["twinserve.examples.tabular:Classifier"],
        ["--workers", "1", "--max-batch-size", "8"],
    )


def test_the_in_process_measurement_imports_a_repository_version_as_the_server_does(tmp_path: Path) -> None:
    """Version 2's model.py imports helper_2.py beside it: the in-process batch curve still measures it."""
    from twinserve.lab.tune.runner import measure_facts

    tuned = subject(None, make_repository(tmp_path), "adder")
    request = TuneRequest(tuned.model, Goal(50.0), 10, tuned.bodies, ceiling_budget_s=0.1, subject=tuned)
    facts = measure_facts(request, 2)
    assert [c.batch_size for c in facts.ceiling] == [1, 8, 32] and facts.rows_per_s(1) > 0


def test_tune_refuses_model_and_repository_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from twinserve.cli import main

    repository = make_repository(tmp_path)
    flags = ["--slo-p95-ms", "50", "--out", str(tmp_path / "out")]
    assert main(["tune", "x:Y", "--model-repository", str(repository), "--model", "adder", *flags]) == 2
    assert "exclusive" in capsys.readouterr().err
    assert main(["tune", "--model-repository", str(repository), "--model", "nope", *flags]) == 2
    assert "no such model folder" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ARCHS)
def test_the_candidates_knobs_reach_the_model_over_its_own_settings(arch: str, tmp_path: Path) -> None:
    """A real server per architecture from the scratch repository: the model runs with the candidate's batch
    size (not its own 4), keeps its own timeout, and a probe against it meets a loose goal."""
    tuned = subject(None, make_repository(tmp_path), "adder")
    request = TuneRequest(tuned.model, Goal(5000.0), 60, tuned.bodies, ready_timeout_s=180, subject=tuned)
    settings: dict[str, int | float] = {"workers": 1, "max_batch_size": 8, "max_batch_delay_ms": 1.0}
    if arch == "sync":
        settings["threads"] = 8
    if arch == "hybrid":
        settings["model_workers"] = 1
    variant = Variant(arch, settings)  # type: ignore[arg-type]
    servers = ProbeServers(request, tmp_path / "scratch")
    try:
        server = servers.get(variant)
        serving = HTTP.get(f"{server.url}/v1/models/adder", timeout=30).json()["serving"]
        assert serving["settings"]["max_batch_size"] == 8 and serving["settings"]["timeout_ms"] == 5000
        assert serving["settings"]["cache_size"] == 8
        reply = HTTP.post(f"{server.url}/v1/models/adder:predict", json={"instances": [1]}, timeout=30)
        assert reply.json()["predictions"] == [201]  # version 2, its own helper
        result = measure_probe(servers, Probe(variant, "rung0", 10.0, 0.5), "adder", request, 0)
        assert meets(result, request.goal)[0], result
    finally:
        servers.close()


# -- what the winner is written as --------------------------------------------------------------------------
def _outcome(tuned: TuneSubject, winner: Variant) -> TuneOutcome:
    goal = Goal(50.0)
    ranked = Ranked(winner, "rung0", 90.0, 90.0, 20.0)
    request = TuneRequest(tuned.model, goal, 10, tuned.bodies, subject=tuned)
    plan = plan_search([winner], {winner.label: 100.0}, goal, budget_s=10)
    decision = Decision(ranked, None, [90.0], False, "done", [ranked])
    return TuneOutcome(request, _facts(), search_space(_facts()), plan, decision, [], tuned.name, 1.0)


def test_the_winner_is_split_into_server_settings_and_the_models_own_table(tmp_path: Path) -> None:
    repository = make_repository(tmp_path)
    tuned = subject(None, repository, "adder")
    winner = Variant("hybrid", {"workers": 1, "model_workers": 2, "max_batch_size": 16, "max_batch_delay_ms": 2.0})
    out = tmp_path / "out"
    written = write_tune_outputs(_outcome(tuned, winner), out, {"hostname": "h", "cpu_count": 2})
    # winner.toml: the server's part, serving the user's repository.
    config = load_config(config_file=written["settings"])
    assert (config.arch, config.workers, config.model_repository) == ("hybrid", 1, repository.resolve())
    assert "max_batch_size" not in written["settings"].read_text()
    assert "models =" not in written["settings"].read_text()  # the repository names them
    record_command = orjson.loads((out / "results.json").read_bytes())["serve_command"]
    assert record_command[:3] == ["twinserve", "serve", "--arch"] and "--model-repository" in record_command
    # winner-model-settings.toml: the [settings] table to paste, the model's own keys kept, the knobs changed.
    text = written["model_settings"].read_text()
    assert str(repository.resolve() / "adder" / "twinserve.toml") in text and "max_batch_size: 4 -> 16" in text
    assert tomllib.loads(text) == {
        "settings": {
            "max_batch_size": 16,
            "cache_size": 8,
            "timeout_ms": 5000,
            "model_workers": 2,
            "max_batch_delay_ms": 2.0,
        }
    }
    record = orjson.loads((out / "results.json").read_bytes())
    assert record["server_settings"] == {"workers": 1} and record["model_settings"] == tomllib.loads(text)["settings"]
    assert record["own_settings"] == tuned.settings
    assert record["model_repository"] == str(repository.resolve())


def test_k8s_reads_a_repository_tunes_server_settings(tmp_path: Path) -> None:
    from twinserve.lab.tune.results import tune_as_results

    repository = make_repository(tmp_path)
    tuned = subject(None, repository, "adder")
    winner = Variant("async", {"workers": 2, "max_batch_size": 16, "max_batch_delay_ms": 2.0})
    out = tmp_path / "out"
    machine = {"hostname": "h", "platform": "p", "python": "3", "cpu_count": 2, "cpu_model": "x", "memory_mib": 1.0}
    write_tune_outputs(_outcome(tuned, winner), out, machine)
    record = orjson.loads((out / "results.json").read_bytes())
    (run,) = tune_as_results(record).runs
    assert run.arch == "async" and run.settings == {"workers": 2}
    assert load_measured(out).model_repository == repository.resolve()
