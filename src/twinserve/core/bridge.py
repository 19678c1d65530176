"""Crossing between blocking and coroutine code.

The sync front runs coroutine hooks on an event loop owned by the calling thread (one per request thread, so
loop-bound clients such as connection pools stay on the loop that made them). The async front runs blocking
hooks on a thread pool so they never stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ["run_coroutine", "run_in_daemon_thread", "run_in_executor"]

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


async def run_in_daemon_thread(fn: Callable[..., T], *args: Any, name: str = "twinserve-load") -> T:
    """Await `fn(*args)` run on a daemon thread of its own, carrying the caller's context variables along.

    For a model's load: nothing can interrupt it, and a server told to stop while it runs must not wait for it at
    exit (a pool's threads are joined at exit, a daemon thread is not). A caller cancelled meanwhile stops waiting;
    the thread runs on, its result dropped."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # the caller was cancelled
            return
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = ctx.run(fn, *args)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
