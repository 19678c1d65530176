"""While the server's first load runs (it answers meanwhile: repository/registry.py `starting`), which version an
unversioned request waits for, and what a version that fails leaves as its model's default: IO-free decisions of
the registry and residency, over a two-version repository whose models load in microseconds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from twinserve.config import load_config
from twinserve.errors import DeadlineExceeded
from twinserve.repository import ModelRegistry, Residency

MODEL = "import twinserve\n\n\nclass Scaler(twinserve.Model):\n    def predict(self, batch):\n        return batch\n"


def _starting(tmp_path: Path) -> tuple[ModelRegistry, Residency]:
    """A repository `scaler` with versions 1 and 2, imported, nothing loaded yet: the server's start."""
    for version in ("1", "2"):
        (tmp_path / "scaler" / version).mkdir(parents=True)
        (tmp_path / "scaler" / version / "model.py").write_text(MODEL)
    (tmp_path / "scaler" / "twinserve.toml").write_text('model = "model.py:Scaler"\n')
    config = load_config(model_repository=str(tmp_path), arch="sync")
    registry = ModelRegistry.from_config(config)
    return registry, Residency(registry, None, config)


def _soon(timeout_ms: int | None) -> float:
    return time.monotonic() + 0.05


def test_an_unversioned_request_waits_for_the_highest_version_not_one_loaded_sooner(tmp_path: Path) -> None:
    registry, residency = _starting(tmp_path)
    one, two = registry.versions_of("scaler")
    assert registry.runtimes["scaler"] is two.runtime  # while starting: the highest version loading
    assert one.runtime is not None
    one.runtime.load()  # the start's load has reached version 1 only
    one.state = "READY"
    assert residency.wait("scaler", "1", _soon) is None  # version 1 itself: at once
    with pytest.raises(DeadlineExceeded, match="while model 'scaler' was loading"):
        residency.wait("scaler", None, _soon)  # the default, version 2, still loads
    registry.load_entries([two])
    assert residency.wait("scaler", None, _soon) is None
    assert registry.runtimes["scaler"] is two.runtime


def test_a_version_that_fails_while_the_server_starts_is_no_longer_the_default(tmp_path: Path) -> None:
    registry, residency = _starting(tmp_path)
    one, two = registry.versions_of("scaler")
    registry.load_entries([one])
    # Version 2's load() raised, the start's load goes on (other models): the failure's own step, looked at here.
    registry._failed(two, RuntimeError("its load() failed"))
    assert two.state == "UNAVAILABLE"
    assert registry.runtimes["scaler"] is one.runtime  # requests that come meanwhile: version 1 answers them
    assert residency.wait("scaler", None, _soon) is None
