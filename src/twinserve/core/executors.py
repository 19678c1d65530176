"""Where `predict` runs, chosen by name: `inline`, `thread` or `process`.

Every executor offers the same two entry points: `arun(batch)` for the asyncio batch driver and `run(batch)` for
the thread batch driver, plus `max_in_flight`, the number of batches it can compute at once (the batch queue
holds the rest back so that batches keep growing while the model is busy). For streaming models, `astream` and
`stream` start one unbatched stream (see `twinserve.core.streams`) where that executor runs predict.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor as PoolExecutor
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from twinserve.config import Config
from twinserve.core.bridge import run_in_daemon_thread, run_in_executor
from twinserve.core.device import Placement
from twinserve.core.hooks import call_async, call_blocking, model_code
from twinserve.core.streams import AsyncGeneratorSteps, AsyncSteps, GeneratorSteps, Steps, ThreadedSteps
from twinserve.core.workers import ProcessPool, WorkerStream
from twinserve.errors import ClientDisconnected
from twinserve.model import Hook, ModelSpec

__all__ = ["EXECUTORS", "Executor", "InlineExecutor", "ModelHandle", "ProcessExecutor", "ThreadExecutor"]


@dataclass(frozen=True)
class ModelHandle:
    """What an executor needs to know of the model it runs."""

    target: str  # import string, for processes that import the model themselves
    spec: ModelSpec
    config: Config  # the model's own effective settings (core/settings.py)
    #: The device and the per-thread streams predict runs on (`--device`).
    placement: Placement = field(default_factory=lambda: Placement("cpu"))
    module: str | None = None  # the module name a model file is imported under (None: from its file name)


class Executor(Protocol):
    name: str
    max_in_flight: int

    async def astart(self) -> None: ...
    def start(self) -> None: ...
    async def arun(self, instances: list[Any]) -> Any: ...
    def run(self, instances: list[Any]) -> Any: ...
    def astream(self, instances: list[Any], deadline: float | None) -> AsyncSteps: ...
    def stream(self, instances: list[Any], deadline: float | None) -> Steps: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class InlineExecutor:
    """`async def predict` awaited on the event loop (a blocking predict runs inline too: only for --debug)."""

    name = "inline"

    def __init__(self, model: ModelHandle) -> None:
        self.spec = model.spec
        self.max_in_flight = model.config.model_workers
        self.placement = model.placement

    async def astart(self) -> None:
        pass

    def start(self) -> None:
        pass

    async def arun(self, instances: list[Any]) -> Any:
        # On the loop's thread, shared with every other coroutine: no stream of its own (see `Placement.entered`).
        with self.placement.entered(), model_code(self.spec.name, "predict"):
            return await call_async(self.spec.apredict, instances, offload=None)

    def run(self, instances: list[Any]) -> Any:
        with self.placement.computing(), model_code(self.spec.name, "predict"):
            return call_blocking(self.spec.predict, instances)

    def astream(self, instances: list[Any], deadline: float | None) -> AsyncSteps:
        hook = _stream_hook(self.spec.astream)
        if hook.is_async:
            return AsyncGeneratorSteps(hook, instances, self.spec.name)
        return ThreadedSteps(GeneratorSteps(hook, instances, self.spec.name), self._stream_pool)

    def stream(self, instances: list[Any], deadline: float | None) -> Steps:
        """In the calling thread (the sync front's request thread)."""
        return GeneratorSteps(_stream_hook(self.spec.stream), instances, self.spec.name)

    @property
    def _stream_pool(self) -> PoolExecutor | None:
        return None  # a blocking generator on the loop: only with --debug, where everything runs inline

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

    @property
    def _stream_pool(self) -> PoolExecutor | None:
        return self._pool

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "threads": self.max_in_flight}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ProcessExecutor:
    """`predict` in a pool of model-worker processes, each loading the model once (the hybrid architecture)."""

    name = "process"

    def __init__(self, model: ModelHandle) -> None:
        self.max_in_flight = model.config.model_workers
        self.pool = ProcessPool(
            model.target, model.config, self.max_in_flight, model.module, model.spec.name, model.placement.device
        )
        # A batch the loop does not send itself (a large one, or one waiting for a worker) waits on these threads.
        self._waiters = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="twinserve-pool-io")
        # Streams wait for a worker on threads of their own: a stream that holds a worker always finds a thread
        # for its next step, however many other streams wait for one.
        self._stream_starts = ThreadPoolExecutor(_STREAM_START_THREADS, thread_name_prefix="twinserve-stream-wait")
        self._stream_steps = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="twinserve-stream-io")

    async def astart(self) -> None:
        # Its workers load the model: on a daemon thread, which a server told to stop meanwhile does not wait for
        # (the workers are daemon processes, ended at exit).
        await run_in_daemon_thread(self.pool.start)

    def start(self) -> None:
        self.pool.start()

    async def arun(self, instances: list[Any]) -> Any:
        return await self.pool.acall(instances, self._waiters)

    def run(self, instances: list[Any]) -> Any:
        return self.pool.call(instances)

    def astream(self, instances: list[Any], deadline: float | None) -> AsyncSteps:
        return _AsyncWorkerSteps(self.pool.stream(instances, deadline), self._stream_starts, self._stream_steps)

    def stream(self, instances: list[Any], deadline: float | None) -> Steps:
        return self.pool.stream(instances, deadline)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "worker_pids": self.pool.pids(), "workers_replaced": self.pool.replaced}

    def close(self) -> None:
        self.pool.close()
        for threads in (self._waiters, self._stream_starts, self._stream_steps):
            threads.shutdown(wait=False, cancel_futures=True)


#: Threads that wait for a model worker on behalf of streams; streams past them wait in line for a thread.
_STREAM_START_THREADS = 8


#: Steps of a model-worker stream read ahead of its client: past them, a client that takes no more loses its stream.
STREAM_BUFFER = 64
#: The end of a stream's steps in its buffer.
_END = object()


class _AsyncWorkerSteps:
    """A `WorkerStream` stepped from the event loop: it waits for a worker on one pool, steps on another.

    The steps are read from the worker as it makes them, into a buffer of `STREAM_BUFFER` steps, so the worker is
    held only while the model computes. A client that stops reading fills the buffer: its stream is closed there
    and the worker goes back to the pool, instead of waiting on that client until its write deadline."""

    def __init__(self, stream: WorkerStream, starts: ThreadPoolExecutor, steps: ThreadPoolExecutor) -> None:
        self._stream = stream
        self._starts = starts
        self._steps = ThreadedSteps(stream, steps)
        self._started = self._released = False
        #: Steps read ahead, then one end: `_END`, or the exception the stream ended with.
        self._buffer: asyncio.Queue[Any] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    def __aiter__(self) -> _AsyncWorkerSteps:
        return self

    async def __anext__(self) -> list[Any]:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read_ahead())
        step = await self._buffer.get()
        if step is _END:
            self._buffer.put_nowait(_END)  # asked again, it is still over
            raise StopAsyncIteration
        if isinstance(step, BaseException):
            self._buffer.put_nowait(step)
            raise step
        return step  # type: ignore[no-any-return]

    async def _read_ahead(self) -> None:
        try:
            await run_in_executor(self._starts, self._stream.start)
            self._started = True
            async for step in self._steps:
                if self._buffer.qsize() >= STREAM_BUFFER:
                    await self._release()
                    self._buffer.put_nowait(
                        ClientDisconnected(f"the client fell {STREAM_BUFFER} steps behind its stream, which was closed")
                    )
                    return
                self._buffer.put_nowait(step)
            self._buffer.put_nowait(_END)
        except Exception as exc:  # the stream's own failure (a model error, a dead worker): the client's to read
            self._buffer.put_nowait(exc)

    async def _release(self) -> None:
        """Close the stream: the worker closes the model's generator and is idle again, once."""
        if self._released:
            return
        self._released = True
        if self._started:
            await self._steps.aclose()
        else:
            self._stream.close()  # safe while `start` still waits for a worker: it hands the worker back

    async def aclose(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.cancel()
            await asyncio.wait([reader])  # it is over before the stream closes (a step in progress settles then)
        await self._release()


def _stream_hook(hook: Hook | None) -> Hook:
    if hook is None:
        raise TypeError("a stream was asked of a model whose predict is not a generator")
    return hook


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
