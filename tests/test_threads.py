"""Each process that runs predict caps its math libraries' threads at its share of the cores (`--model-threads`)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.serving import Server, model_path, predict
from twinserve.config import Config


@pytest.fixture
def four_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.parametrize(
    "settings, threads",
    [
        ({"arch": "sync"}, 1),  # a worker per core
        ({"arch": "sync", "workers": 2}, 2),
        ({"arch": "async"}, 4),  # one process computes
        ({"arch": "async", "workers": 2}, 2),
        ({"arch": "async", "executor": "thread", "model_workers": 4}, 4),  # threads of one process share its cap
        ({"arch": "hybrid", "model_workers": 2}, 2),  # the model workers compute, not the server process
        ({"arch": "hybrid", "workers": 2, "model_workers": 4}, 1),  # 8 processes on 4 cores: at least one thread
        ({"arch": "async", "model_threads": 3}, 3),
    ],
)
def test_the_cores_are_shared_among_the_processes_that_compute(
    four_cores: None, settings: dict[str, object], threads: int
) -> None:
    assert Config(**settings).effective_model_threads == threads  # type: ignore[arg-type]


def test_omp_num_threads_set_by_the_user_is_left_alone(four_cores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert Config(arch="async").effective_model_threads is None
    assert Config(arch="async", model_threads=3).effective_model_threads == 3  # the flag says it outright


def _threads_where_predict_runs(arch: str, *flags: str) -> dict[str, int]:
    with Server([model_path("MathThreads")], arch, *flags) as server:
        response = predict(server, "math-threads", [0])
    assert response.status_code == 200, response.text
    found: dict[str, int] = response.json()["predictions"][0]
    assert found, "numpy's BLAS is loaded in every model process: threadpoolctl must see it"
    if importlib.util.find_spec("torch") is not None:
        assert "torch" in found
    return found


@pytest.mark.parametrize("arch", ["sync", "async", "hybrid"])
def test_model_threads_caps_every_math_library_where_predict_runs(arch: str) -> None:
    # 3: unlike any library's default on the usual machines (one per core), so a cap not applied shows
    assert set(_threads_where_predict_runs(arch, "--workers", "1", "--model-threads", "3").values()) == {3}


def test_by_default_model_workers_share_the_cores() -> None:
    found = _threads_where_predict_runs("hybrid", "--model-workers", "2")
    assert set(found.values()) == {max(1, (os.cpu_count() or 1) // 2)}
