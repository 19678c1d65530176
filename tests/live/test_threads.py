"""Each process that runs predict caps its math libraries' threads at its share of the cores (`--model-threads`)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from tests.serving import Server, model_path, predict
from twinserve.config import Config
from twinserve.core import threads


@pytest.fixture
def four_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # sync's default workers
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    for name in threads.USER_THREAD_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "settings, executor, expected",
    [
        ({"arch": "sync"}, "request-thread", 1),  # a worker per core, 4 request threads each
        ({"arch": "sync", "workers": 1, "threads": 2}, "request-thread", 2),  # each request thread runs predict
        ({"arch": "sync", "workers": 1, "max_batch_size": 8}, "thread", 4),  # one batch thread computes
        ({"arch": "async"}, "thread", 4),  # one process, one predict at a time
        ({"arch": "async", "workers": 2}, "thread", 2),
        ({"arch": "async", "executor": "thread", "model_workers": 4}, "thread", 1),  # 4 predicts at once
        ({"arch": "hybrid", "model_workers": 2}, "process", 2),  # the model workers compute, one batch each
        ({"arch": "hybrid", "workers": 2, "model_workers": 4}, "process", 1),  # 8 on 4 cores: at least one thread
        ({"arch": "async", "model_threads": 3}, "thread", 3),
    ],
)
def test_the_cores_are_shared_among_the_predicts_run_at_once(
    four_cores: None, settings: dict[str, object], executor: str, expected: int
) -> None:
    assert threads.model_threads(Config(**settings), executor) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("name", threads.USER_THREAD_VARS)
def test_threads_the_user_chose_are_left_alone(four_cores: None, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "2")
    assert threads.model_threads(Config(arch="async"), "thread") is None
    assert threads.model_threads(Config(arch="async", model_threads=3), "thread") == 3  # the flag says it outright


@pytest.mark.parametrize(
    "cpu_max, cores",
    [
        ("max 100000\n", 4),  # no limit: the affinity
        ("300000 100000\n", 3),  # limits.cpu: 3
        ("150000 100000\n", 1),  # 1.5 CPUs of time: one core's worth of busy threads
        ("50000 100000\n", 1),  # at least one
        ("800000 100000\n", 4),  # a quota above the cores this process may run on
    ],
)
def test_usable_cores_are_the_affinity_under_the_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str, cores: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(threads, "CPU_MAX", tmp_path / "cpu.max")
    assert threads.usable_cores() == cores
    monkeypatch.setattr(threads, "CPU_MAX", tmp_path / "absent")  # no cgroup v2
    assert threads.usable_cores() == 4


def test_a_derived_cap_only_lowers_and_the_flag_sets(four_cores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads._Cap, "threads", None)
    monkeypatch.setattr(threads._Cap, "exact", False)
    before = {info["prefix"]: int(info["num_threads"]) for info in threadpool_info()}
    torch = sys.modules.get("torch")  # imported by an earlier test in this process, maybe: left as found
    torch_before = torch.get_num_threads() if torch is not None else None
    try:
        threadpool_limits(limits=1, user_api="blas")
        # numpy's BLAS runs 1 thread here: a derived cap of 4 must not raise it
        assert threads.limit_threads(Config(arch="async"), "thread") == 4
        assert _blas_threads() == {1}
        assert threads.limit_threads(Config(arch="async", model_threads=2), "thread") == 2
        assert _blas_threads() == {2}  # the flag sets it outright
        assert threads.limit_threads(Config(arch="async", workers=4), "thread") == 1
        assert _blas_threads() == {1}  # a derived cap below a library's count lowers it
    finally:
        threadpool_limits(limits=before)
        if torch is not None:
            torch.set_num_threads(torch_before)


def _blas_threads() -> set[int]:
    return {int(info["num_threads"]) for info in threadpool_info() if info["user_api"] == "blas"}


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


def test_by_default_model_workers_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in threads.USER_THREAD_VARS:  # the server inherits this environment
        monkeypatch.delenv(name, raising=False)
    found = _threads_where_predict_runs("hybrid", "--model-workers", "2")
    share = max(1, threads.usable_cores() // 2)
    assert all(count <= share for count in found.values()), found
