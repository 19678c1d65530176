"""A user's model that uses every optional hook of `twinserve.Model`, typed as a user would type it.

The tests serve it and type-check it with `mypy --strict` against the installed twinserve (its `py.typed`).

    twinserve serve examples/models/every_hook.py:Scaler --arch async
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np
from pydantic import BaseModel, Field

import twinserve


class Reading(BaseModel):
    sensor: str = Field(min_length=1)
    value: float


class Scaler(twinserve.Model):
    """Scales readings by a per-sensor factor; every hook in its plain and its coroutine form."""

    name = "scaler"
    version = "2"
    inputs = (twinserve.Tensor("value", "FP64", [-1]),)
    outputs = (twinserve.Tensor("scaled", "FP64", [-1]),)

    def load(self) -> None:
        self.factors = {"a": 2.0, "b": 10.0}

    def preprocess(self, instance: Reading) -> float:
        return instance.value * self.factors.get(instance.sensor, 1.0)

    async def apreprocess(self, instance: Reading) -> float:
        await asyncio.sleep(0)  # where a real model awaits its feature store
        return self.preprocess(instance)

    def predict(self, batch: list[float]) -> list[float]:
        return [round(x, 6) for x in batch]

    async def apredict(self, batch: list[float]) -> list[float]:
        return self.predict(batch)

    def from_tensors(self, arrays: dict[str, np.ndarray]) -> list[Reading]:
        return [Reading(sensor="a", value=float(v)) for v in arrays["value"]]

    def to_tensors(self, outputs: list[float]) -> dict[str, np.ndarray]:
        return {"scaled": np.asarray(outputs, dtype=np.float64)}

    def examples(self) -> list[Reading]:
        return [Reading(sensor="a", value=1.5), Reading(sensor="b", value=-2.0)]


class Words(twinserve.Model):
    """A streaming model: each step holds one chunk per instance."""

    def predict(self, batch: list[str]) -> Iterator[list[str]]:
        words = [prompt.split() for prompt in batch]
        for i in range(max(map(len, words), default=0)):
            yield [w[i] if i < len(w) else "" for w in words]

    async def apredict(self, batch: list[str]) -> AsyncIterator[list[str]]:
        for step in self.predict(batch):
            yield step


class OnlyAsync(twinserve.Model):
    """A model with just `apredict` (and an async `load`): served by the sync front too."""

    async def load(self) -> None:
        self.offset = 1

    async def apredict(self, batch: list[int]) -> list[int]:
        return [x + self.offset for x in batch]
