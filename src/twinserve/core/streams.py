"""Streaming predict calls, stepped by whoever sends the steps: one generator call per request, never batched.

A step is computed only when the caller asks for the next one, so nothing more is computed once it stops asking;
closing a stream closes the model's generator (its `finally` runs) wherever it lives. `Steps` / `AsyncSteps` are
the blocking and coroutine shapes; `GeneratorSteps` and `AsyncGeneratorSteps` step the model's generator on the
calling thread or the event loop; `ThreadedSteps` steps a blocking `Steps` on a thread pool, so the event loop
never blocks on the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncGenerator, Generator
from concurrent.futures import Executor, Future
from typing import Any, Protocol

from twinserve.core.bridge import run_coroutine
from twinserve.core.hooks import model_code
from twinserve.model import Hook, check_step

__all__ = ["AsyncGeneratorSteps", "AsyncSteps", "GeneratorSteps", "Steps", "ThreadedSteps", "step_or_none"]


class Steps(Protocol):
    """A stream stepped from a thread: `next()` blocks for one step (StopIteration at the end)."""

    def __iter__(self) -> Steps: ...
    def __next__(self) -> list[Any]: ...
    def close(self) -> None: ...


class AsyncSteps(Protocol):
    """A stream stepped from the event loop (StopAsyncIteration at the end). `aclose` may follow a step whose
    awaiting task was cancelled: it waits for that step to settle before closing the generator."""

    def __aiter__(self) -> AsyncSteps: ...
    async def __anext__(self) -> list[Any]: ...
    async def aclose(self) -> None: ...


async def step_or_none(steps: AsyncSteps) -> list[Any] | None:
    """The next step, or None at the end: `next(steps, None)` for the event loop."""
    try:
        return await steps.__anext__()
    except StopAsyncIteration:
        return None


_END = object()  # StopIteration cannot travel through futures or coroutines


async def _anext_or_end(gen: AsyncGenerator[Any, None]) -> Any:
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return _END


class GeneratorSteps:
    """The model's streaming predict, called once for `instances` and stepped on the calling thread."""

    def __init__(self, hook: Hook, instances: list[Any], model: str) -> None:
        self._model = model
        self._expected = len(instances)
        self._async = hook.is_async
        with model_code(model, "predict"):
            # Calling a generator function runs none of its body: the first step does.
            self._gen: Generator[Any, None, None] | AsyncGenerator[Any, None] = hook.fn(instances)

    def __iter__(self) -> GeneratorSteps:
        return self

    def __next__(self) -> list[Any]:
        with model_code(self._model, "predict"):
            if isinstance(self._gen, AsyncGenerator):
                step = run_coroutine(_anext_or_end(self._gen))
            else:
                step = next(self._gen, _END)
        if step is _END:
            raise StopIteration
        return check_step(step, self._expected)

    def close(self) -> None:
        """Close the generator (its `finally` runs); a no-op once it has ended."""
        with model_code(self._model, "predict"):
            if isinstance(self._gen, AsyncGenerator):
                run_coroutine(self._gen.aclose())
            else:
                self._gen.close()


class AsyncGeneratorSteps:
    """The model's async-generator predict, stepped on the event loop; cancelling a step stops it there."""

    def __init__(self, hook: Hook, instances: list[Any], model: str) -> None:
        self._model = model
        self._expected = len(instances)
        with model_code(model, "predict"):
            self._gen: AsyncGenerator[Any, None] = hook.fn(instances)

    def __aiter__(self) -> AsyncGeneratorSteps:
        return self

    async def __anext__(self) -> list[Any]:
        with model_code(self._model, "predict"):
            step = await _anext_or_end(self._gen)
        if step is _END:
            raise StopAsyncIteration
        return check_step(step, self._expected)

    async def aclose(self) -> None:
        with model_code(self._model, "predict"):
            await self._gen.aclose()


class ThreadedSteps:
    """A blocking `Steps` stepped on `pool` (inline when None), one step at a time, context variables carried."""

    def __init__(self, steps: Steps, pool: Executor | None) -> None:
        self._steps = steps
        self._pool = pool
        self._pending: Future[Any] | None = None

    def __aiter__(self) -> ThreadedSteps:
        return self

    def _step(self) -> Any:
        return next(self._steps, _END)

    async def __anext__(self) -> list[Any]:
        if self._pool is None:
            step = self._step()
        else:
            self._pending = self._pool.submit(contextvars.copy_context().run, self._step)
            # If this await is cancelled the step still runs to its end on its thread: `aclose` waits for it.
            step = await asyncio.wrap_future(self._pending)
            self._pending = None
        if step is _END:
            raise StopAsyncIteration
        return step  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not pending.cancelled():  # cancelled: it never started
            with contextlib.suppress(Exception):  # its outcome no longer matters, only that it is over
                await asyncio.wrap_future(pending)
        if self._pool is None:
            self._steps.close()
        else:
            await asyncio.wrap_future(self._pool.submit(self._steps.close))
