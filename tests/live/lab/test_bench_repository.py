"""`twinserve bench --model-repository DIR`: every architecture serves the repository and the levels are driven at
each model's default version in turn, or at one named model and version over the versioned routes; runs, results
and the servers' access logs name the model and version."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from twinserve.errors import ConfigError
from twinserve.lab.bench import repository_targets
from twinserve.lab.plan import BenchTarget
from twinserve.lab.results import Results, load_results

#: Answers which version computed it; has examples, so bench needs no payload.
VERSIONED = textwrap.dedent(
    """
    from pathlib import Path


    class Scaler:
        def load(self):
            self.factor = int((Path(__file__).parent / "factor.txt").read_text())

        def predict(self, batch):
            return [x * self.factor for x in batch]

        def examples(self):
            return [1, 2, 3]
    """
)


def make_repository(root: Path) -> Path:
    """`scaler` in versions 1 and 2 (2 the default), `flat` as version 1, and a broken folder bench skips."""
    for name, numbers in (("scaler", (1, 2)), ("flat", ())):
        (root / name).mkdir(parents=True)
        (root / name / "twinserve.toml").write_text('model = "model.py:Scaler"\n')
        for number in numbers or (1,):
            folder = root / name / str(number) if numbers else root / name
            folder.mkdir(exist_ok=True)
            (folder / "model.py").write_text(VERSIONED)
            (folder / "factor.txt").write_text(str(number * 10))
    (root / "broken").mkdir()
    (root / "broken" / "twinserve.toml").write_text("not toml [")
    return root


def bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    argv = ["bench", "--out", str(out), "--warmup", "0.5", "--duration", "1", "--concurrency", "2", *args]
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", *argv, "--ceiling-sizes", "1"], capture_output=True, text=True, timeout=600
    )
    return done, out


def access_events(out: Path, arch: str) -> list[dict[str, Any]]:
    """The server's access log (JSON lines) of `arch`'s run."""
    lines = (out / "logs" / f"{arch}.log").read_text().splitlines()
    events = [orjson.loads(line) for line in lines if line.startswith("{")]
    return [e for e in events if e.get("logger") == "twinserve.access" and e.get("model")]


def answered(events: list[dict[str, Any]], path_part: str) -> set[tuple[str, str]]:
    """(model, version) of the predictions answered on paths containing `path_part`."""
    return {(e["model"], str(e["version"])) for e in events if path_part in e.get("path", "") and e["status"] == 200}


def test_targets_are_each_models_default_version_or_the_named_one(tmp_path: Path) -> None:
    root = make_repository(tmp_path)
    assert [(t.model, t.version, t.versioned) for t in repository_targets(root)] == [
        ("flat", "1", False),
        ("scaler", "2", False),  # the broken folder is skipped: it cannot be served
    ]
    (named,) = repository_targets(root, "scaler", "1")
    assert named == BenchTarget("scaler", "1", True, f"{root / 'scaler' / '1' / 'model.py'}:Scaler")
    for model, version, message in [
        ("nope", None, "has no model 'nope'"),
        ("scaler", "3", "serves versions 1, 2, not '3'"),
        (None, "1", "name the model too"),
        ("broken", None, "twinserve.toml"),
    ]:
        with pytest.raises(ConfigError, match=message):
            repository_targets(root, model, version)


def test_each_model_in_every_architecture(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    done, out = bench(tmp_path, "--model-repository", str(repository), "--arch", "sync,async,hybrid")
    assert done.returncode == 0, done.stdout + done.stderr
    results = load_results(out / "results.json")
    assert results.repository == str(repository) and results.model == str(repository)
    labels = [(r.label, r.arch, r.model, r.version) for r in results.runs]
    assert labels == [
        (f"{arch} {model} v{version}", arch, model, version)
        for arch in ("sync", "async", "hybrid")
        for model, version in (("flat", "1"), ("scaler", "2"))
    ]
    check(results)
    for arch in ("sync", "async", "hybrid"):
        events = access_events(out, arch)
        # The unversioned routes: the default version answered, and the access log says which.
        assert answered(events, ":predict") == {("flat", "1"), ("scaler", "2")}
    assert "- sync scaler v2: measuring 2 conns (1 s after a 0.5 s warm-up)" in done.stdout
    assert results.ceiling and results.verdicts  # on the first model measured (flat v1)


def test_a_named_version_over_the_versioned_routes(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    argv = ["--model-repository", str(repository), "--model", "scaler", "--version", "1", "--arch", "async"]
    done, out = bench(tmp_path, *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    results = load_results(out / "results.json")
    (run,) = results.runs
    assert (run.label, run.model, run.version) == ("async scaler v1", "scaler", "1")
    check(results)
    events = access_events(out, "async")
    assert answered(events, "/v1/models/scaler/versions/1:predict") == {("scaler", "1")}
    assert not answered(events, "/v1/models/scaler:predict")  # the default version (2) was never driven


def test_bench_refuses_what_a_repository_cannot_mean(tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    for argv, message in [
        (["twinserve.examples.tabular:Classifier", "--model-repository", str(repository)], "are exclusive"),
        (["--model", "scaler"], "choose within a --model-repository"),
        (["--model-repository", str(repository), "--model", "scaler", "--version", "9"], "not '9'"),
        (["--model-repository", str(tmp_path / "missing")], "is not a folder"),
    ]:
        done, _ = bench(tmp_path, *argv)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def check(results: Results) -> None:
    for run in results.runs:
        assert run.error is None, run.error
        (level,) = run.levels
        assert level.ok > 0 and level.errors == 0 and level.server is not None
