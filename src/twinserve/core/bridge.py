"""Crossing between blocking and coroutine code.

The sync front runs coroutine hooks on an event loop owned by the calling thread (one per request thread, so
loop-bound clients such as connection pools stay on the loop that made them). The async front runs blocking
hooks on a thread pool so they never stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ["run_coroutine", "run_in_executor"]

T = TypeVar("T")

_local = threading.local()


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on this thread's own long-lived event loop."""
    runner: asyncio.Runner | None = getattr(_local, "runner", None)
    if runner is None:
        runner = asyncio.Runner()
        _local.runner = runner
    return runner.run(coro)


async def run_in_executor(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """Await `fn(*args)` run on `executor`, carrying the caller's context variables along."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(executor, functools.partial(ctx.run, fn, *args))
