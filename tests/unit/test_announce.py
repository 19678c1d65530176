"""What a server says when it starts listening (`twinserve.servers.announce`): what it serves and where, as one
JSON event or plain lines for a person. No server: the function is called with the port a server would have bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from twinserve.config import load_config
from twinserve.servers import announce

MODEL = "import twinserve\n\n\nclass M(twinserve.Model):\n    def predict(self, batch):\n        return batch\n"


def _repository(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "twinserve.toml").write_text('model = "model.py:M"\n')
        (root / name / "model.py").write_text(MODEL)
    return root


def test_a_repository_server_names_the_repository_and_its_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #43: it named the default MODEL, `twinserve.examples.tabular:Classifier`, which it does not serve."""
    root = _repository(tmp_path / "models", "tokenizer", "classifier")
    with capture_logs() as events:
        announce(load_config(model_repository=str(root), log_format="json"), 8000)
    (serving,) = [e for e in events if e["event"] == "serving"]
    assert serving["models"] == ["classifier", "tokenizer"] and serving["repository"] == str(root)
    assert serving["url"] == "http://127.0.0.1:8000" and serving["curl"] is None

    announce(load_config(model_repository=str(root), log_format="console"), 8000)
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith(f"twinserve: serving classifier, tokenizer from the model repository {root} (sync) on ")
    assert "tabular" not in line


def test_an_empty_repository_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _repository(tmp_path / "models")
    root.mkdir()
    announce(load_config(model_repository=str(root), log_format="console"), 8000)
    assert f"serving no models yet from the model repository {root} " in capsys.readouterr().err


def test_model_arguments_are_named_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    with capture_logs() as events:
        announce(load_config(log_format="json"), 8000)
    (serving,) = [e for e in events if e["event"] == "serving"]
    assert serving["models"] == ["twinserve.examples.tabular:Classifier"] and serving["repository"] is None
    assert serving["curl"].startswith("curl -s http://127.0.0.1:8000/v1/models/iris:predict")
