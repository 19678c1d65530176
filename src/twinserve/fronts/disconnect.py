"""A queued request whose client leaves is never computed. twinserve's protocol under uvicorn publishes each
request's state in the ASGI scope (`DISCONNECT_EXTENSION`), polled when a batch is formed, and the body when it
has all arrived; under another server (Ray Serve, test transports) a watcher task per request awaits
`http.disconnect` and cancels the request's wait. The extension spares each request that task and the body's
read through `receive`, which the async front's throughput needs (docs/results.md, 2026-12-08).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from twinserve.core.runtime import ModelRuntime
from twinserve.errors import ClientDisconnected
from twinserve.fronts.sse import client_left

__all__ = ["DISCONNECT_EXTENSION", "arrived_body", "disconnect_flag", "predict_unless_gone", "unless_disconnected"]

T = TypeVar("T")

#: The ASGI scope extension in which a server tells whether a request's client has gone:
#: `scope["extensions"][DISCONNECT_EXTENSION] = {"disconnected": <a callable returning bool, no argument>,
#: "body": <a callable returning the whole body if it has all arrived and none of it was read, else None>}`.
#: twinserve's protocol under uvicorn (servers/asgi/protocol.py) publishes it; without it a watcher task is used.
DISCONNECT_EXTENSION = "twinserve.disconnect"


def disconnect_flag(request: Request) -> Callable[[], bool] | None:
    """The server's own answer to "has this request's client gone?" (`DISCONNECT_EXTENSION`), polled when a
    batch is formed, with no task per request; None under a server that does not publish it."""
    published = _published(request)
    return None if published is None else published["disconnected"]


def arrived_body(request: Request) -> bytes | None:
    """The request's whole body, if the server publishes it (`DISCONNECT_EXTENSION`) and it has all arrived
    unread; None otherwise (read it through `receive`)."""
    published = _published(request)
    take = None if published is None else published.get("body")
    return None if take is None else take()


def _published(request: Request) -> dict[str, Any] | None:
    extensions = request.scope.get("extensions")
    return extensions.get(DISCONNECT_EXTENSION) if extensions else None


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
    gone = disconnect_flag(request)
    if gone is not None:
        return await runtime.apredict(instances, deadline, gone)
    return await unless_disconnected(request, runtime.apredict(instances, deadline))
