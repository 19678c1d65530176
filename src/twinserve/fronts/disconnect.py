"""A queued request whose client leaves is never computed: a watcher task per request awaits `http.disconnect`
(the ASGI server's word that the client left) and cancels the request's wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from twinserve.core.runtime import ModelRuntime
from twinserve.errors import ClientDisconnected
from twinserve.fronts.sse import client_left

__all__ = ["predict_unless_gone", "unless_disconnected"]

T = TypeVar("T")


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await `work`, cancelling it if the client goes away first (a queued request then leaves the queue).

    One watcher task per request, which cancels this one on disconnect: cheaper than running `work` as a task too.
    """
    current = asyncio.current_task()
    assert current is not None
    waiting = True

    def on_disconnect(watcher: asyncio.Task[None]) -> None:
        if waiting and not watcher.cancelled():
            current.cancel()

    watcher = asyncio.get_running_loop().create_task(client_left(request.receive))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled() and current.uncancel() == 0:
            raise ClientDisconnected("the client closed the connection before the answer was ready") from None
        raise
    finally:
        waiting = False
        watcher.cancel()


async def predict_unless_gone(
    request: Request, runtime: ModelRuntime, instances: list[Any], deadline: float | None
) -> Any:
    """The outputs for `instances`, unless the client leaves first (then they are never computed)."""
    return await unless_disconnected(request, runtime.apredict(instances, deadline))
