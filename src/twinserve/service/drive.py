"""The order of an inference request's steps, once, for every front that reads a body (fronts/asgi.py,
fronts/wsgi.py): admit from the head (after waiting for a loading model), read the body, decode it, predict,
encode. The front gives its own I/O: the object it reads from (`source`: Starlette's request, Flask's), how it
reads the body, how it waits for the model; the exchange checks each step (service/lifecycle.py).

An async twin and a blocking one, the same steps. The I/O is passed as module-level functions and the front's own
request object, so that driving a request allocates nothing of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from twinserve.core.runtime import ModelRuntime
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import BodyRule, RequestHead
from twinserve.service.reply import Reply

__all__ = ["adecoded", "ainfer", "decoded", "infer"]

S = TypeVar("S")


async def adecoded(
    exchange: Exchange, head: RequestHead, source: S, body: Callable[[S, BodyRule], Awaitable[bytes]]
) -> tuple[ModelRuntime, list[Any]]:
    """The admitted model and the decoded instances: admit (waiting for a loading model), read, decode."""
    runtime = await exchange.aadmit(head)
    return runtime, await exchange.adecode(await body(source, exchange.service.body), head.header_length)


async def ainfer(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    body: Callable[[S, BodyRule], Awaitable[bytes]],
    predict: Callable[[S, ModelRuntime, list[Any], float | None], Awaitable[Any]],
) -> Reply:
    """One inference request on the event loop, from its head to its reply."""
    runtime = await exchange.aadmit(head)
    instances = await exchange.adecode(await body(source, exchange.service.body), head.header_length)
    return exchange.encode(await predict(source, runtime, instances, exchange.deadline))


def decoded(
    exchange: Exchange, head: RequestHead, source: S, body: Callable[[S, BodyRule], bytes]
) -> tuple[ModelRuntime, list[Any]]:
    """`adecoded`, blocking (the sync front's request thread)."""
    runtime = exchange.wait_admit(head)
    return runtime, exchange.decode(body(source, exchange.service.body), head.header_length)


def infer(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    body: Callable[[S, BodyRule], bytes],
    predict: Callable[[S, ModelRuntime, list[Any], float | None], Any],
) -> Reply:
    """`ainfer`, blocking (the sync front's request thread)."""
    runtime = exchange.wait_admit(head)
    instances = exchange.decode(body(source, exchange.service.body), head.header_length)
    return exchange.encode(predict(source, runtime, instances, exchange.deadline))
