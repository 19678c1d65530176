"""`twinserve serve --config FILE.toml`: the file's keys are Config field names; flags > file > env > defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from twinserve.cli import build_parser, main
from twinserve.config import Config, load_config
from twinserve.deploy.commands import k8s_config
from twinserve.errors import ConfigError
from twinserve.lab.settings_writer import settings_file_text


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


def _serve_config(argv: list[str]) -> Config:
    """The Config `twinserve serve ARGV` would serve with (what `cli._serve` builds)."""
    args = build_parser(["serve", *argv]).parse_args(["serve", *argv])
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "command"}
    if not overrides.get("models"):
        overrides.pop("models")
    return load_config(**overrides)


def test_the_file_sets_what_flags_leave_unset(tmp_path: Path) -> None:
    path = _write(tmp_path, 'arch = "async"\nworkers = 2\nmax_batch_size = 16\nmax_batch_delay_ms = 2.5\n')
    config = _serve_config(["--config", str(path)])
    assert (config.arch, config.workers, config.max_batch_size, config.max_batch_delay_ms) == ("async", 2, 16, 2.5)
    assert config.threads == Config.model_fields["threads"].default


def test_flags_beat_the_file_which_beats_env_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINSERVE_WORKERS", "5")
    monkeypatch.setenv("TWINSERVE_THREADS", "7")
    path = _write(tmp_path, 'arch = "async"\nworkers = 2\n')
    config = _serve_config(["--config", str(path), "--arch", "hybrid"])
    assert config.arch == "hybrid"  # flag over file
    assert config.workers == 2  # file over env
    assert config.threads == 7  # env where the file is silent
    assert config.model_workers == 1  # default where all are silent


def test_models_can_come_from_the_file_and_a_positional_model_wins(tmp_path: Path) -> None:
    path = _write(tmp_path, 'models = ["a.b:C"]\n')
    assert _serve_config(["--config", str(path)]).models == ["a.b:C"]
    assert _serve_config(["x.y:Z", "--config", str(path)]).models == ["x.y:Z"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_batch_sise = 8\n", r"unknown setting 'max_batch_sise' \(did you mean 'max_batch_size'\?\)"),
        ("max-batch-size = 8\n", r"unknown setting 'max-batch-size' \(did you mean 'max_batch_size'\?\)"),
        ("colour = 'blue'\n", r"unknown setting 'colour'$"),
        ("[server]\narch = 'sync'\n", r"'server' is a table"),
        ("arch = \n", r"is not valid TOML"),
        ("workers = 0\n", r"settings\.toml: workers: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_file_is_a_clear_error_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"^--config: .*" + message):
        load_config(config_file=path)


def test_a_missing_file_is_an_error_not_silence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--config: no such file: "):
        load_config(config_file=tmp_path / "absent.toml")


def test_serve_fails_in_one_line_on_an_unknown_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "wrkers = 2\n")
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    expected = f"twinserve: error: --config: {path}: unknown setting 'wrkers' (did you mean 'workers'?)"
    assert err.strip().splitlines() == [expected]


@pytest.mark.parametrize(
    "settings",
    [
        {"arch": "async", "workers": 2, "max_batch_size": 16, "max_batch_delay_ms": 2.0},
        {"arch": "sync", "workers": 3, "threads": 8, "worker_class": "gthread"},
        {"arch": "hybrid", "model_workers": 4, "cors_origins": ["https://a.example"], "access_log": False},
        {"models": ["twinserve.examples.tabular:Classifier", "pkg.mod:Other"], "rate_limit": 50.5},
    ],
)
def test_a_written_file_reads_back_into_the_same_config(tmp_path: Path, settings: dict[str, Any]) -> None:
    config = load_config(**settings)
    path = _write(tmp_path, settings_file_text(config, "written by a test\n\nsecond line"))
    assert load_config(config_file=path) == config
    assert _serve_config(["--config", str(path)]) == config


def test_api_keys_never_go_into_a_written_file() -> None:
    text = settings_file_text(load_config(api_keys=["k" * 20]))
    assert "api_keys =" not in text and "k" * 20 not in text  # a comment names it (tests/unit/test_secret_settings.py)


def test_k8s_takes_the_file_and_keeps_its_workers(tmp_path: Path) -> None:
    path = _write(tmp_path, 'arch = "async"\nworkers = 3\nmax_batch_size = 8\n')
    config = k8s_config({"config_file": path})
    assert (config.arch, config.workers, config.max_batch_size, config.host) == ("async", 3, 8, "0.0.0.0")
    assert k8s_config({"config_file": _write(tmp_path, 'arch = "sync"\n')}).workers == 1  # still pinned when unset


def test_twinserve_k8s_takes_the_tuned_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, 'models = ["twinserve.examples.tabular:Classifier"]\narch = "async"\nworkers = 2\n')
    assert main(["k8s", "--image", "example/twinserve:1", "--config", str(path), "--max-batch-size", "8"]) == 0
    manifests = capsys.readouterr().out
    command = next(line for line in manifests.splitlines() if "Generated by twinserve" in line)
    assert "--arch async" in command and "--workers 2" in command and "--max-batch-size 8" in command
