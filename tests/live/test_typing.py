"""A user's model file type-checks under `mypy --strict` against twinserve's own annotations (PEP 561 `py.typed`),
and one that breaks the contract does not: the check can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving import HTTP, ROOT, Server

EVERY_HOOK = ROOT / "examples" / "models" / "every_hook.py"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for this module's runs, none of the project's: the first run checks twinserve and what it imports
    (most of a run's time), the others only recheck the user's file."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy_strict(file: Path, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """mypy --strict on `file` as a user would run it: outside this project, so none of its settings apply."""
    (cwd / "mypy.ini").write_text("[mypy]\n")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--strict", "--cache-dir", str(cache), str(file)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_twinserve_ships_its_annotations() -> None:
    assert (ROOT / "src" / "twinserve" / "py.typed").is_file()


def test_a_model_using_every_hook_type_checks_strictly(tmp_path: Path, mypy_cache: Path) -> None:
    done = mypy_strict(EVERY_HOOK, tmp_path, mypy_cache)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("    def predict(self, batch: list[int]) -> int:\n        return 1\n", "incompatible with return type"),
        ("    def load(self, path: str) -> None:\n        pass\n", 'Signature of "load" incompatible'),
        ("    name = 3\n    def predict(self, batch: list[int]) -> list[int]:\n        return batch\n", "str | None"),
        (
            "    def predict(self, batch: list[int]) -> list[int]:\n        return twinserve.nope(batch)\n",
            'has no attribute "nope"',
        ),
    ],
)
def test_a_model_that_breaks_the_contract_does_not(tmp_path: Path, mypy_cache: Path, body: str, error: str) -> None:
    model = tmp_path / "broken.py"
    model.write_text(f"import twinserve\n\n\nclass Broken(twinserve.Model):\n{body}")
    done = mypy_strict(model, tmp_path, mypy_cache)
    assert done.returncode == 1 and error in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("arch", ["sync", "async"])
def test_the_typed_example_serves(arch: str) -> None:

    models = [f"{EVERY_HOOK}:Scaler", f"{EVERY_HOOK}:OnlyAsync"]
    with Server(models, arch) as server:
        body = {"instances": [{"sensor": "a", "value": 1.5}, {"sensor": "b", "value": -2.0}]}
        answer = HTTP.post(f"{server.url}/v1/models/scaler:predict", json=body, timeout=30)
        assert answer.json() == {"predictions": [3.0, -20.0]}
        answer = HTTP.post(f"{server.url}/v1/models/onlyasync:predict", json={"instances": [1, 2]}, timeout=30)
        assert answer.json() == {"predictions": [2, 3]}  # apredict alone serves in the sync front too
