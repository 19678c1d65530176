"""Which request is being served now, carried by context variables into model code.

A front opens a `RequestContext` per request. The batcher copies each request's id to wherever its batch is
computed (a batcher thread, an executor thread, a model-worker process), so a model's own log lines name the
requests they belong to; it also notes the batch size and queue wait each request saw, for the request log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from twinserve.observability.tracing import BatchTrace, RequestTrace

__all__ = [
    "RequestContext",
    "close_request",
    "computing",
    "current_request",
    "open_request",
    "request_id",
    "request_ids",
]


@dataclass(slots=True, eq=False)
class RequestContext:
    """One request as the request log sees it; the fronts fill the HTTP side, the batcher the rest."""

    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    batch_size: int | None = None
    queue_wait_s: float | None = None
    #: Its priority level, 1 the highest (`X-Priority`, V2 `parameters.priority`, else `--default-priority`).
    priority: int = 1
    #: Its spans, when tracing is on.
    trace: RequestTrace | None = None


_request: ContextVar[RequestContext | None] = ContextVar("twinserve_request", default=None)
#: Ids of the requests whose model code runs in this context: one while a request is handled, a batch's worth
#: while its batch is computed.
_ids: ContextVar[tuple[str, ...]] = ContextVar("twinserve_request_ids", default=())


def current_request() -> RequestContext | None:
    return _request.get()


def open_request(context: RequestContext) -> None:
    """Make `context` the current request (each request runs in its own task or, on a thread, replaces the last)."""
    _request.set(context)
    _ids.set((context.request_id,))


def close_request() -> None:
    _request.set(None)
    _ids.set(())


def request_ids() -> tuple[str, ...]:
    """Ids of the requests being served where this is called: in `predict`, every request in the batch."""
    return _ids.get()


def request_id() -> str | None:
    """The id of the request being served where this is called; None outside a request or in a shared batch."""
    ids = _ids.get()
    return ids[0] if len(ids) == 1 else None


@contextmanager
def computing(ids: Sequence[str], trace: BatchTrace | None = None) -> Iterator[None]:
    """Run a batch's model code under its requests' ids (and, when traced, within their predict spans)."""
    token = _ids.set(tuple(ids))
    try:
        if trace is None:
            yield
        else:
            with trace:
                yield
    finally:
        _ids.reset(token)
