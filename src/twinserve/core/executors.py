"""Where `predict` runs, chosen by name: `inline`, `thread` or `process`.

Every executor offers the same two entry points: `arun(batch)` for the asyncio batch driver and `run(batch)` for
the thread batch driver, plus `max_in_flight`, the number of batches it can compute at once (the batch queue
holds the rest back so that batches keep growing while the model is busy).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from twinserve.config import Config
from twinserve.core.bridge import run_in_executor
from twinserve.core.hooks import call_async, call_blocking, model_code
from twinserve.core.workers import ProcessPool
from twinserve.model import ModelSpec

__all__ = ["EXECUTORS", "Executor", "InlineExecutor", "ModelHandle", "ProcessExecutor", "ThreadExecutor"]


@dataclass(frozen=True)
class ModelHandle:
    """What an executor needs to know of the model it runs."""

    target: str  # import string, for processes that import the model themselves
    spec: ModelSpec
    config: Config


class Executor(Protocol):
    name: str
    max_in_flight: int

    async def astart(self) -> None: ...
    def start(self) -> None: ...
    async def arun(self, instances: list[Any]) -> Any: ...
    def run(self, instances: list[Any]) -> Any: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class InlineExecutor:
    """`async def predict` awaited on the event loop (a blocking predict runs inline too: only for --debug)."""

    name = "inline"

    def __init__(self, model: ModelHandle) -> None:
        self.spec = model.spec
        self.max_in_flight = model.config.model_workers

    async def astart(self) -> None:
        pass

    def start(self) -> None:
        pass

    async def arun(self, instances: list[Any]) -> Any:
        with model_code(self.spec.name, "predict"):
            return await call_async(self.spec.apredict, instances, offload=None)

    def run(self, instances: list[Any]) -> Any:
        with model_code(self.spec.name, "predict"):
            return call_blocking(self.spec.predict, instances)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name}

    def close(self) -> None:
        pass


class ThreadExecutor(InlineExecutor):
    """`predict` on dedicated threads: for libraries that release the GIL (numpy, torch, scikit-learn...)."""

    name = "thread"

    def __init__(self, model: ModelHandle) -> None:
        super().__init__(model)
        self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix=f"twinserve-predict-{self.spec.name}")

    async def arun(self, instances: list[Any]) -> Any:
        return await run_in_executor(self._pool, self.run, instances)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "threads": self.max_in_flight}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ProcessExecutor:
    """`predict` in a pool of model-worker processes, each loading the model once (the hybrid architecture)."""

    name = "process"

    def __init__(self, model: ModelHandle) -> None:
        self.max_in_flight = model.config.model_workers
        self.pool = ProcessPool(model.target, model.config, self.max_in_flight)
        # One thread per worker waits on its pipe, so the event loop never blocks on a worker.
        self._waiters = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="twinserve-pool-io")

    async def astart(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.pool.start)

    def start(self) -> None:
        self.pool.start()

    async def arun(self, instances: list[Any]) -> Any:
        return await run_in_executor(self._waiters, self.pool.call, instances)

    def run(self, instances: list[Any]) -> Any:
        return self.pool.call(instances)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "worker_pids": self.pool.pids(), "workers_replaced": self.pool.replaced}

    def close(self) -> None:
        self.pool.close()
        self._waiters.shutdown(wait=False, cancel_futures=True)


#: `--executor` name -> class.
EXECUTORS: dict[str, type[InlineExecutor] | type[ProcessExecutor]] = {
    "inline": InlineExecutor,
    "thread": ThreadExecutor,
    "process": ProcessExecutor,
}


def resolve_executor(config: Config, spec: ModelSpec) -> str:
    """`auto` -> process for hybrid, inline for a coroutine predict, else thread."""
    name = config.resolved_arch_executor
    if name != "auto":
        return name
    if config.debug:
        return "inline"
    return "inline" if spec.apredict.is_async else "thread"
