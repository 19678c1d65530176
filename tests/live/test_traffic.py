"""Traffic split and shadow as pure parts (repository/traffic.py, repository/shadow.py): the policy read from a
`[traffic]` table, its draws, stable sticky keys, output comparison and the bounded shadow runner; no server."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.serving import wait_until
from twinserve.observability.metrics import render
from twinserve.repository import read_model
from twinserve.repository.shadow import ShadowJob, ShadowRunner, outputs_agree
from twinserve.repository.traffic import Shadow, TrafficPolicy, key_fraction


def within_bounds(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """Whether `count` successes out of `n` draws fit a binomial of probability `p` within `sigmas` deviations."""
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


# -- the policy ------------------------------------------------------------------------------------------------
def test_a_table_reads_into_a_policy_and_back() -> None:
    table = {"split": {"1": 90, "2": 10.5}, "sticky_header": "X-Session-Id", "shadow": {"version": 3, "share": 0.2}}
    policy = TrafficPolicy.parse(table, ["1", "2", "3"])
    assert policy.split == {"1": 90.0, "2": 10.5}
    assert policy.sticky_header == "X-Session-Id"
    assert policy.shadow == Shadow("3", 0.2)
    described = policy.describe()
    assert described == {
        "split": {"1": 90, "2": 10.5},
        "sticky_header": "X-Session-Id",
        "shadow": {"version": "3", "share": 0.2},
    }
    assert TrafficPolicy.parse(described) == policy
    assert TrafficPolicy.parse({}).describe() == {"split": {}, "sticky_header": None, "shadow": None}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"split": {"1": 0}}, "at least one version needs a weight above 0"),
        ({"split": {"1": 0, "2": 0}}, "at least one version needs a weight above 0"),
        ({"split": {"1": math.inf, "2": 1}}, "weight of version 1 must be a finite number, 0 or more"),
        ({"split": {"1": math.nan}}, "finite number, 0 or more"),
        ({"shadow": {"version": "2", "share": math.nan}}, "share must be a number from 0 to 1"),
        ({"split": {"1": -3}}, "finite number, 0 or more"),
        ({"split": {"1": True}}, "finite number, 0 or more"),
        ({"split": {"1": "ten"}}, "finite number, 0 or more"),
        ({"split": {"one": 1}}, "'one' is not a version number"),
        ({"split": [1, 2]}, "must map versions to weights"),
        ({"split": {"1": 1, "7": 1}}, "traffic names version(s) 7, not served (versions: 1, 2)"),
        ({"shadow": {"version": "9", "share": 0.5}}, "traffic names version(s) 9"),
        ({"shadow": {"version": "2", "share": 1.5}}, "share must be a number from 0 to 1"),
        ({"shadow": {"version": "2", "share": -0.1}}, "share must be a number from 0 to 1"),
        ({"shadow": {"share": 0.1}}, "traffic.shadow must be"),
        ({"shadow": {"version": "2", "ratio": 0.1}}, "traffic.shadow must be"),
        ({"sticky_header": ""}, "sticky_header must be a header name"),
        ({"weights": {}}, "unknown key(s) weights"),
        ([1], "must be a table"),
    ],
)
def test_a_bad_table_names_its_problem(table: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        TrafficPolicy.parse(table, ["1", "2"])
    assert message in str(caught.value)


def test_the_draw_falls_into_each_versions_share() -> None:
    policy = TrafficPolicy.parse({"split": {"2": 20, "1": 80}})
    ready = {"1", "2"}
    assert policy.primary(None, ready, draw=0.0) == "1"
    assert policy.primary(None, ready, draw=0.79) == "1"
    assert policy.primary(None, ready, draw=0.81) == "2"
    assert policy.primary(None, ready, draw=0.999999) == "2"
    # Only versions ready now share the traffic; none ready: the default answers (None).
    assert {policy.primary(None, {"2"}, draw=d) for d in (0.0, 0.5, 0.99)} == {"2"}
    assert policy.primary(None, {"3"}) is None
    assert TrafficPolicy().primary(None, ready) is None


def test_a_weight_of_zero_drains_a_version_that_stays_loaded() -> None:
    """The usual way to drain a version (issue #55): weight 0 sends it no unversioned request at any draw or key."""
    policy = TrafficPolicy.parse({"split": {"1": 0, "2": 100}}, ["1", "2"])
    assert {policy.primary(None, {"1", "2"}, draw=d) for d in (0.0, 0.3, 0.999999)} == {"2"}
    assert {policy.primary(f"user-{i}", {"1", "2"}) for i in range(50)} == {"2"}
    assert policy.primary(None, {"1"}) is None  # only the drained one ready: the default answers


def test_random_draws_keep_the_split_within_binomial_bounds() -> None:
    policy = TrafficPolicy.parse({"split": {"1": 80, "2": 20}})
    n = 10_000
    second = sum(policy.primary(None, {"1", "2"}) == "2" for _ in range(n))
    assert within_bounds(second, n, 0.2), second


def test_sticky_keys_keep_their_version_and_spread_like_the_split() -> None:
    policy = TrafficPolicy.parse({"split": {"1": 80, "2": 20}, "sticky_header": "X-Session-Id"})
    keys = [f"session-{i}" for i in range(2000)]
    first = {key: policy.primary(key, {"1", "2"}) for key in keys}
    assert all(policy.primary(key, {"1", "2"}) == first[key] for key in keys for _ in range(3))
    assert within_bounds(sum(v == "2" for v in first.values()), len(keys), 0.2)
    assert policy.key({"x-session-id": "abc"}) == "abc"  # every front answers to the lower-case name
    assert policy.key({}) is None and policy.key(None) is None
    assert TrafficPolicy().key({"x-session-id": "abc"}) is None


def test_a_sticky_key_hashes_alike_in_every_process() -> None:
    """Not Python's salted `hash()`: another interpreter, with another hash seed, draws the same fraction."""
    code = "from twinserve.repository.traffic import key_fraction; print(repr(key_fraction('user-42')))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(other.stdout) == key_fraction("user-42")
    assert 0 <= key_fraction("") < 1
    assert key_fraction("user-42") != key_fraction("user-42", salt=b"shadow")


def test_the_shadow_takes_its_share() -> None:
    policy = TrafficPolicy.parse({"shadow": {"version": "3", "share": 0.25}})
    assert policy.shadowed(None, draw=0.2) == "3"
    assert policy.shadowed(None, draw=0.3) is None
    n = 10_000
    assert within_bounds(sum(policy.shadowed(None) == "3" for _ in range(n)), n, 0.25)
    assert TrafficPolicy.parse({"shadow": {"version": "3", "share": 0}}).shadowed(None, draw=0.0) is None
    assert TrafficPolicy.parse({"shadow": {"version": "3"}}).shadowed("any") == "3"  # share 1 by default
    sticky = TrafficPolicy.parse({"shadow": {"version": "3", "share": 0.5}, "sticky_header": "k"})
    assert all(sticky.shadowed(f"k{i}") == sticky.shadowed(f"k{i}") for i in range(100))


# -- the [traffic] table of twinserve.toml ---------------------------------------------------------------------
def _model_folder(root: Path, toml: str) -> Path:
    for number in (1, 2):
        (root / str(number)).mkdir(parents=True, exist_ok=True)
        (root / str(number) / "model.py").write_text("class M:\n    def predict(self, b):\n        return b\n")
    (root / "twinserve.toml").write_text(toml)
    return root


def test_the_settings_file_carries_the_traffic_table(tmp_path: Path) -> None:
    toml = 'model = "model.py:M"\n[traffic]\nsplit = {"1" = 90, "2" = 10}\nshadow = {version = "1", share = 0.5}\n'
    folder = read_model(_model_folder(tmp_path / "m", toml))
    assert folder.error is None and folder.traffic is not None
    assert folder.traffic.split == {"1": 90.0, "2": 10.0}
    assert read_model(_model_folder(tmp_path / "plain", 'model = "model.py:M"\n')).traffic is None


@pytest.mark.parametrize(
    ("traffic", "message"),
    [
        ('split = {"1" = 90, "3" = 10}', "traffic names version(s) 3, not served (versions: 1, 2)"),
        ('split = {"1" = 0}', "at least one version needs a weight above 0"),
        ('split = {"1" = inf, "2" = 1}', "must be a finite number, 0 or more"),  # TOML's inf took every request
        ('shadow = {version = "2", share = 2}', "share must be a number from 0 to 1"),
    ],
)
def test_a_bad_traffic_table_is_the_models_error(tmp_path: Path, traffic: str, message: str) -> None:
    folder = read_model(_model_folder(tmp_path / "m", f'model = "model.py:M"\n[traffic]\n{traffic}\n'))
    assert folder.error is not None and message in folder.error and "twinserve.toml" in folder.error


def test_a_version_the_policy_leaves_out_cannot_take_traffic(tmp_path: Path) -> None:
    toml = 'model = "model.py:M"\nversions = {latest = 1}\n[traffic]\nsplit = {"1" = 1, "2" = 1}\n'
    folder = read_model(_model_folder(tmp_path / "m", toml))
    assert folder.error is not None and "version(s) 1, not served (versions: 2)" in folder.error


# -- comparing outputs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "agree"),
    [
        ([1, 2], [1, 2], True),
        ([1, 2], [1, 3], False),
        ([1, 2], [1, 2, 3], False),
        ([0.1 + 0.2], [0.3], True),
        ([1.0], [1.001], False),
        ([float("nan")], [float("nan")], True),
        ([{"label": "cat", "p": 0.5}], [{"label": "cat", "p": 0.5 + 1e-12}], True),
        ([{"label": "cat"}], [{"label": "dog"}], False),
        ([{"label": "cat"}], [{"name": "cat"}], False),
        (["abc"], ["abc"], True),
        (["abc"], [["a", "b", "c"]], False),
        ([True], [1], True),
        ([np.array([1.0, 2.0])], [np.array([1.0, 2.0 + 1e-9])], True),
        ([np.array([1.0, 2.0])], [[1.0, 2.5]], False),
        ([np.array([1, 2])], [np.array([[1, 2]])], False),
        ([np.array(["a"])], [np.array(["a"])], True),
        ([None], [None], True),
    ],
)
def test_outputs_agree_when_equal_or_numerically_close(a: Any, b: Any, agree: bool) -> None:
    assert outputs_agree(a, b) is agree


# -- the runner ------------------------------------------------------------------------------------------------
class _Occupancy:
    def __init__(self, open_: bool = True) -> None:
        self.open = open_
        self.inside = 0

    def enter(self) -> bool:
        if self.open:
            self.inside += 1
        return self.open

    def leave(self) -> None:
        self.inside -= 1


class _Spec:
    version = "2"


class _Config:
    timeout_ms: int | None = None
    arch = "sync"


class _FakeRuntime:
    """What the runner uses of a ModelRuntime; predict waits for `gate` and answers `answer(instances)`."""

    def __init__(self, gate: threading.Event, open_: bool = True, fail: bool = False) -> None:
        self.gate = gate
        self.fail = fail
        self.occupancy = _Occupancy(open_)
        self.spec = _Spec()
        self.config = _Config()
        self.computing = threading.Event()

    def predict(self, instances: list[Any], deadline: float | None = None) -> list[Any]:
        self.computing.set()
        assert self.gate.wait(30)
        if self.fail:
            raise RuntimeError("shadow broke")
        return [x * 2 for x in instances]


def _count(model: str, outcome: str) -> float:
    for line in render().decode().splitlines():
        sample = line.startswith("twinserve_shadow_requests_total{") and f'model="{model}"' in line
        if sample and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _job(model: str, runtime: Any, instances: list[int], outputs: list[int]) -> ShadowJob:
    return ShadowJob(model, "1", runtime, instances, outputs, 0.001)


def test_the_sync_runner_never_blocks_and_drops_past_its_bound() -> None:
    gate = threading.Event()
    runtime = _FakeRuntime(gate)
    runner = ShadowRunner(capacity=1, threads=1)
    model = "runner-bound"
    runner.submit(_job(model, runtime, [1], [2]))
    assert runtime.computing.wait(30)  # the thread computes it, held on the gate
    for _ in range(3):  # one queued, two dropped: submit never waits
        runner.submit(_job(model, runtime, [1], [2]))
    wait_until(lambda: _count(model, "dropped") == 2)
    gate.set()
    wait_until(lambda: _count(model, "agree") == 2)
    wait_until(lambda: runtime.occupancy.inside == 0)


def test_the_runner_counts_disagreements_errors_and_unloading_versions() -> None:
    gate = threading.Event()
    gate.set()
    runner = ShadowRunner(capacity=8, threads=1)
    model = "runner-outcomes"
    runner.submit(_job(model, _FakeRuntime(gate), [1, 2], [2, 5]))
    runner.submit(_job(model, _FakeRuntime(gate, fail=True), [1], [2]))
    closed = _FakeRuntime(gate, open_=False)
    runner.submit(_job(model, closed, [1], [2]))
    wait_until(lambda: (_count(model, "disagree"), _count(model, "error"), _count(model, "dropped")) == (1, 1, 1))
    assert closed.occupancy.inside == 0


def test_the_async_runner_is_a_task_that_never_delays_the_caller() -> None:
    import asyncio

    class AsyncRuntime(_FakeRuntime):
        opened = asyncio.Event()  # made and set on the test's loop, the one the runner's tasks run on

        async def apredict(self, instances: list[Any], deadline: float | None = None) -> list[Any]:
            await self.opened.wait()
            return [x * 2 for x in instances]

    gate = threading.Event()
    runtime = AsyncRuntime(gate)
    runtime.config.arch = "async"
    runner = ShadowRunner(capacity=2)
    model = "runner-async"

    async def main() -> None:
        for _ in range(3):
            runner.submit(_job(model, runtime, [1], [2]))  # returns at once: the third finds the bound full
        assert _count(model, "dropped") == 1
        runtime.opened.set()
        await asyncio.to_thread(wait_until, lambda: _count(model, "agree") == 2)

    asyncio.run(main())
    assert runtime.occupancy.inside == 0


@pytest.mark.parametrize(
    ("fail", "outcome", "logged", "never"),
    [
        (False, "disagree", "shadow version 2 disagreed with version 1", ("[5]", "[2]")),  # never the outputs
        # Before (issue #44): a warning per failure (the model's traceback aside: model_code logs it per batch).
        (True, "error", "shadow version 2 failed (RuntimeError)", ("shadow broke",)),  # never the exception's text
    ],
    ids=["disagreements", "failures"],
)
def test_outcomes_are_logged_at_most_once_an_interval(
    caplog: pytest.LogCaptureFixture, fail: bool, outcome: str, logged: str, never: tuple[str, ...]
) -> None:
    gate = threading.Event()
    gate.set()
    runner = ShadowRunner(capacity=8, threads=1)
    model = f"runner-logged-{outcome}"
    with caplog.at_level("WARNING", logger="twinserve.shadow"):
        for _ in range(3):
            runner.submit(_job(model, _FakeRuntime(gate, fail=fail), [1], [5]))
        wait_until(lambda: _count(model, outcome) == 3)
    lines = [r.getMessage() for r in caplog.records if r.name == "twinserve.shadow"]
    assert len(lines) == 1 and logged in lines[0], lines
    assert not any(text in lines[0] for text in never)
