"""A coroutine `preprocess` on the event loop's path: one instance is awaited in the request's own task, several
overlap (`asyncio.gather`); either way each instance's answer, and a failing instance's error, are the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from twinserve.config import load_config
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import ValidationFailed


class Fetching:
    """Each instance "fetched" by a coroutine that notes the task it runs in; a negative one is refused."""

    name = "fetching"

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def preprocess(self, instance: int) -> int:
        self.tasks.append(asyncio.current_task())
        if instance < 0:
            raise ValidationFailed(f"instance {instance} is negative")
        return instance * 10

    def predict(self, batch: list[int]) -> list[int]:
        return [value + 1 for value in batch]


@pytest.mark.parametrize("arch", ["async", "hybrid"])
def test_one_instance_and_several_are_preprocessed_alike(arch: str) -> None:
    runtime = ModelRuntime("tests.unit.core.test_preprocess:Fetching", load_config(arch=arch))

    async def scenario() -> None:
        await runtime.aload()
        try:
            model: Fetching = runtime.model
            assert await runtime.apredict([3]) == [31]
            assert model.tasks == [asyncio.current_task()], "one instance: awaited in the request's own task"
            model.tasks.clear()
            assert await runtime.apredict([1, 2, 3]) == [11, 21, 31]
            assert len(set(model.tasks)) == 3 and asyncio.current_task() not in model.tasks, "several: overlapped"
            for instances in ([-1], [1, -1]):
                with pytest.raises(ValidationFailed, match="instance -1 is negative"):
                    await runtime.apredict(instances)
            assert await runtime.apredict([4]) == [41], "a refused instance leaves the runtime serving"
        finally:
            await runtime.aclose()

    asyncio.run(scenario())
