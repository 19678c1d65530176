"""`winner.toml` names its model so that `twinserve serve --config winner.toml` finds it from any folder (issue #55:
tune's file named `bc.py:Model` relative to where tune ran, and failed elsewhere with "no such file")."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.lab.tune.report import portable_model
from twinserve.model import import_model


def test_a_model_file_is_named_by_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bc.py").write_text("class Model:\n    def predict(self, batch):\n        return batch\n")
    monkeypatch.chdir(tmp_path)
    named = portable_model("bc.py:Model")
    assert named == f"{tmp_path.resolve() / 'bc.py'}:Model"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert import_model(named).__name__ == "Model"


def test_a_module_importable_only_from_here_is_named_by_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "localmodel.py").write_text("class Model:\n    def predict(self, batch):\n        return batch\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert portable_model("localmodel:Model") == f"{tmp_path.resolve() / 'localmodel.py'}:Model"


def test_an_installed_module_is_left_as_it_is() -> None:
    assert portable_model("twinserve.examples.tabular:Classifier") == "twinserve.examples.tabular:Classifier"
