"""Failure isolation on its own: the bisection policy, its drivers, and the batch drivers that use it."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from twinserve.core.batcher import AsyncBatcher, BatchQueue, ThreadBatcher
from twinserve.core.isolation import Bisection, abisect, bisect, isolatable, split_outputs
from twinserve.errors import (
    ClientDisconnected,
    DeadlineExceeded,
    ModelFailed,
    OutputMismatch,
    TwinserveError,
    ValidationFailed,
    WorkerDied,
)

pytestmark = pytest.mark.timeout(60)


class PoisonModel:
    """Fails any batch holding an instance starting with "bad"; counts its calls."""

    def __init__(self, error: type[TwinserveError] = ModelFailed) -> None:
        self.calls: list[list[Any]] = []
        self.error = error

    def __call__(self, batch: list[Any]) -> list[Any]:
        self.calls.append(list(batch))
        if any(str(x).startswith("bad") for x in batch):
            raise self.error(f"poisoned: {batch}")
        return [f"out-{x}" for x in batch]


def groups_with(bad: set[int], m: int) -> list[list[str]]:
    return [[f"bad{r}" if r in bad else f"ok{r}"] for r in range(m)]


def test_one_bad_request_among_eight_takes_two_log2_reruns() -> None:
    model = PoisonModel()
    groups = groups_with({5}, 8)
    result = bisect(model, groups, ModelFailed("whole batch"), max_reruns=100)
    assert result.failed == [5]
    assert [o for i, o in enumerate(result.outcomes) if i != 5] == [[f"out-ok{r}"] for r in range(8) if r != 5]
    assert result.reruns == len(model.calls) == 2 * 3
    assert model.calls[0] == ["ok0", "ok1", "ok2", "ok3"]  # halves, left first


@pytest.mark.parametrize("seed", range(40))
def test_every_request_is_settled_correctly_within_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    m = rng.randint(2, 40)
    bad = set(rng.sample(range(m), rng.randint(1, min(m, 5))))
    sizes = [rng.randint(1, 3) for _ in range(m)]
    # Only one instance of a bad request is bad: the whole request must still fail.
    groups = [[f"bad{r}" if r in bad and i == 0 else f"ok{r}.{i}" for i in range(sizes[r])] for r in range(m)]
    model = PoisonModel()
    result = bisect(model, groups, ModelFailed("whole batch"), max_reruns=10_000)
    assert set(result.failed) == bad
    for r in range(m):
        if r not in bad:
            assert result.outcomes[r] == [f"out-{x}" for x in groups[r]]
    assert result.reruns == len(model.calls) <= 2 * len(bad) * math.ceil(math.log2(m))


def test_budget_caps_reruns_and_fails_the_unresolved_with_their_last_error() -> None:
    model = PoisonModel()
    result = bisect(model, groups_with({7}, 8), ModelFailed("whole batch"), max_reruns=2)
    assert result.reruns == len(model.calls) == 2
    # [0..3] answered; [4..7] failed in the second re-run, and the budget ran out before its halves.
    assert result.outcomes[:4] == [[f"out-ok{r}"] for r in range(4)]
    assert result.failed == [4, 5, 6, 7]
    assert all("bad7" in str(result.outcomes[r]) for r in result.failed)


@pytest.mark.parametrize(
    "error", [OutputMismatch("miscounted"), WorkerDied("pid 1 died"), TwinserveError("shutting down")]
)
def test_errors_not_of_the_models_making_fail_the_whole_batch_without_reruns(error: TwinserveError) -> None:
    assert not isolatable(error)
    model = PoisonModel()
    result = bisect(model, groups_with({1}, 4), error, max_reruns=100)
    assert result.reruns == 0 and model.calls == []
    assert result.outcomes == [error] * 4


def test_a_rejection_raised_by_the_model_is_isolated_too() -> None:
    assert isolatable(ValidationFailed("bad instance")) and not isolatable(ClientDisconnected("gone"))
    model = PoisonModel(ValidationFailed)
    result = bisect(model, groups_with({2}, 4), ValidationFailed("whole batch"), max_reruns=100)
    assert result.failed == [2] and isinstance(result.outcomes[2], ValidationFailed)


def test_requests_nobody_waits_for_are_not_computed_again() -> None:
    model = PoisonModel()
    gone = {1, 2, 3}  # e.g. their clients left or their deadlines passed while the batch was being isolated
    result = bisect(model, groups_with({0}, 4), ModelFailed("whole"), 100, abandoned=gone.__contains__)
    assert model.calls == [["bad0"]]  # [0 1] -> [0] only; [2 3] -> nothing left to run
    assert result.reruns == 1 and result.failed == [0, 1, 2, 3]


def test_a_single_request_is_not_rerun() -> None:
    plan = Bisection([3], ModelFailed("x"), max_reruns=100)
    assert plan.next() is None
    assert plan.result().failed == [0] and plan.result().reruns == 0


def test_a_half_that_miscounts_fails_its_own_requests() -> None:
    def model(batch: list[Any]) -> list[Any]:
        if "bad" in batch:
            raise ModelFailed("bad")
        return batch[:-1] if "short" in batch else batch

    result = bisect(model, [["a"], ["short"], ["bad"], ["d"]], ModelFailed("whole"), max_reruns=100)
    assert result.outcomes[0] == result.outcomes[1]  # the half [a, short] miscounted: both fail, unsplit
    assert isinstance(result.outcomes[0], OutputMismatch)
    assert isinstance(result.outcomes[2], ModelFailed) and result.outcomes[3] == ["d"]


def test_policy_refuses_misuse() -> None:
    plan = Bisection([1, 1], ModelFailed("x"), max_reruns=5)
    with pytest.raises(RuntimeError):
        plan.succeeded([[1]])
    assert plan.next() == [0]
    with pytest.raises(RuntimeError):
        plan.next()
    with pytest.raises(RuntimeError):
        plan.result()
    with pytest.raises(ValueError):
        plan.succeeded([[1], [2]])
    with pytest.raises(ValueError):
        Bisection([1], ModelFailed("x"), max_reruns=-1)


def test_split_outputs_checks_the_count() -> None:
    assert split_outputs([1, 2], ["a", "b", "c"]) == [["a"], ["b", "c"]]
    with pytest.raises(OutputMismatch, match="returned 2 outputs for 3 inputs"):
        split_outputs([1, 2], ["a", "b"])
    with pytest.raises(OutputMismatch, match="must return a list"):
        split_outputs([1], 3)


def test_async_driver_matches_the_blocking_one() -> None:
    model = PoisonModel()

    async def run(batch: list[Any]) -> list[Any]:
        await asyncio.sleep(0)
        return model(batch)

    groups = groups_with({0, 6}, 7)
    result = asyncio.run(abisect(run, groups, ModelFailed("whole"), max_reruns=100))
    blocking = PoisonModel()
    expected = bisect(blocking, groups, ModelFailed("whole"), max_reruns=100)
    assert model.calls == blocking.calls and result.reruns == expected.reruns
    assert [str(o) for o in result.outcomes] == [str(o) for o in expected.outcomes]
    assert result.failed == [0, 6]


# -- the batch drivers -------------------------------------------------------------------------------------------
async def _submit_together(batcher: AsyncBatcher, requests: list[list[Any]]) -> list[Any]:
    """Queue every request before the collector runs, so that they form one batch."""
    tasks = [asyncio.create_task(batcher.submit(r, None)) for r in requests]
    await asyncio.sleep(0)  # every submit has queued its request
    batcher.start()
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


REQUESTS = [["a"], ["bad-b"], ["c", "d"], ["e", "bad-e"], ["f"]]


def _check_isolated(results: list[Any]) -> None:
    assert results[0] == ["out-a"] and results[2] == ["out-c", "out-d"] and results[4] == ["out-f"]
    assert isinstance(results[1], ModelFailed) and isinstance(results[3], ModelFailed)


def test_async_batcher_answers_the_good_requests_of_a_poisoned_batch(caplog: pytest.LogCaptureFixture) -> None:
    model = PoisonModel()

    async def run(batch: list[Any]) -> list[Any]:
        return model(batch)

    async def main() -> tuple[list[Any], AsyncBatcher]:
        batcher = AsyncBatcher(BatchQueue(16, 0.0, 100, 1), run, max_reruns=16)
        results = await _submit_together(batcher, REQUESTS)
        await batcher.close()
        return results, batcher

    with caplog.at_level("WARNING", logger="twinserve.batcher"):
        results, batcher = asyncio.run(main())
    _check_isolated(results)
    assert len(model.calls[0]) == 7  # one batch of every request, then the re-runs
    stats = batcher.stats
    assert (stats.batches, stats.isolated, stats.isolation_failed) == (1, 1, 2)
    assert stats.isolation_reruns == len(model.calls) - 1 == 8
    assert "isolated 2 failing request(s)" in caplog.text


def test_async_batcher_without_budget_fails_the_whole_batch() -> None:
    model = PoisonModel()

    async def run(batch: list[Any]) -> list[Any]:
        return model(batch)

    async def main() -> list[Any]:
        batcher = AsyncBatcher(BatchQueue(16, 0.0, 100, 1), run)
        results = await _submit_together(batcher, REQUESTS)
        await batcher.close()
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, ModelFailed) for r in results)
    assert len(model.calls) == 1


def test_thread_batcher_answers_the_good_requests_of_a_poisoned_batch() -> None:
    release = threading.Event()
    model = PoisonModel()

    def run(batch: list[Any]) -> list[Any]:
        if batch == ["hold"]:
            release.wait(timeout=30)
            return batch
        return model(batch)

    batcher = ThreadBatcher(BatchQueue(16, 0.0, 100, 1), run, workers=1, max_reruns=16)
    results: dict[int, Any] = {}

    def client(i: int, instances: list[Any]) -> None:
        try:
            results[i] = batcher.submit(instances, None)
        except TwinserveError as exc:
            results[i] = exc

    holder = threading.Thread(target=client, args=(-1, ["hold"]))
    holder.start()
    _until(lambda: batcher.queue.in_flight == 1)  # the only slot is held: the others queue into one batch
    clients = [threading.Thread(target=client, args=(i, r)) for i, r in enumerate(REQUESTS)]
    for t in clients:
        t.start()
    _until(lambda: batcher.queue.queued_instances == 7)
    release.set()
    for t in [holder, *clients]:
        t.join(timeout=30)
    batcher.close()
    _check_isolated([results[i] for i in range(len(REQUESTS))])
    assert len(model.calls[0]) == 7
    assert (batcher.stats.isolated, batcher.stats.isolation_failed) == (1, 2)


def test_async_batcher_does_not_recompute_a_request_that_expired_meanwhile() -> None:
    model = PoisonModel()

    late_deadline = time.monotonic() + 0.05

    async def run(batch: list[Any]) -> list[Any]:
        while len(model.calls) == 0 and time.monotonic() <= late_deadline:
            await asyncio.sleep(0.01)  # the first, whole-batch call outlives the deadline of one request
        return model(batch)

    async def main() -> list[Any]:
        batcher = AsyncBatcher(BatchQueue(16, 0.0, 100, 1), run, max_reruns=16)
        tasks = [
            asyncio.create_task(batcher.submit(["a"], None)),
            asyncio.create_task(batcher.submit(["late"], late_deadline)),
            asyncio.create_task(batcher.submit(["bad"], None)),
        ]
        await asyncio.sleep(0)
        batcher.start()
        results = list(await asyncio.gather(*tasks, return_exceptions=True))
        await batcher.close()
        return results

    a, late, bad = asyncio.run(main())
    assert a == ["out-a"] and isinstance(late, DeadlineExceeded) and isinstance(bad, ModelFailed)
    assert all("late" not in call for call in model.calls[1:])
