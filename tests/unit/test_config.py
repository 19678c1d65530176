from __future__ import annotations

import pytest

from twinserve.config import DEFAULT_MODEL, Config, load_config
from twinserve.errors import ConfigError


def test_defaults() -> None:
    config = load_config()
    assert config.models == [DEFAULT_MODEL]
    assert config.arch == "sync"
    assert config.threads == 4
    assert config.max_body_bytes == 16 * 1024 * 1024


def test_flags_beat_env_which_beats_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINSERVE_THREADS", "6")
    monkeypatch.setenv("TWINSERVE_ARCH", "async")
    monkeypatch.setenv("TWINSERVE_MODELS", '["a.b:C"]')
    config = load_config(threads="8", arch=None)
    assert config.threads == 8
    assert config.arch == "async"
    assert config.models == ["a.b:C"]


def test_effective_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert load_config(arch="sync").effective_workers == 6
    assert load_config(arch="async").effective_workers == 1
    assert load_config(arch="async", workers=3).effective_workers == 3
    assert load_config(arch="sync", debug=True).effective_workers == 1


def test_errors_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--graceful-timeout: Input should be greater than or equal to 0$"):
        load_config(graceful_timeout=-1)
    with pytest.raises(ConfigError, match=r"^--arch: "):
        load_config(arch="hybridish")
    with pytest.raises(ConfigError, match=r"^--no-such-setting: Extra inputs are not permitted"):
        load_config(no_such_setting=1)


def test_config_round_trips_through_json() -> None:
    config = load_config(arch="async", workers=2, models=["x.y:Z"])
    assert Config.model_validate_json(config.model_dump_json()) == config
