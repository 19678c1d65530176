"""Dynamic batching: a pure policy over a queue, driven by an asyncio driver or a thread driver.

`BatchQueue` decides what to flush and when, from the queue and a clock reading passed in; it never sleeps,
locks or touches a future, so its decisions are unit-tested directly. A batch is flushed when it is full
(`max_batch_size` instances), when its oldest request has waited `max_delay` seconds, and only while fewer than
`max_in_flight` batches are computing; with `max_delay=0` requests go out as soon as a slot is free and batches
form by themselves while the model is busy. A request's instances stay together, in order. Expired and
cancelled requests are taken out before compute.

`AsyncBatcher` (async and hybrid fronts) and `ThreadBatcher` (the sync front, opt-in) own the waiting: they put
requests in, sleep until `next_flush_at`, run batches on an `Executor`, split results back, and resolve every
waiter in all cases (result, model error, worker death, deadline), so nothing hangs. When the model fails a batch
of several requests, both drivers find the failing ones by bisection (`twinserve.core.isolation`) when given a
re-run budget, so the others are still answered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from twinserve.core.admission import QueueBound
from twinserve.core.isolation import Isolated, Outcome, abisect, bisect, isolatable, split_outputs
from twinserve.errors import ClientDisconnected, DeadlineExceeded, QueueFull, TwinserveError, internal_error
from twinserve.observability.context import RequestContext, computing, current_request
from twinserve.observability.tracing import BatchTrace

__all__ = ["AsyncBatcher", "Batch", "BatchQueue", "BatchStats", "Pending", "ThreadBatcher", "deadline_passed"]

logger = logging.getLogger("twinserve.batcher")

W = TypeVar("W")  # the driver's waiter: an asyncio.Future or a concurrent.futures.Future


@dataclass(eq=False)
class Pending(Generic[W]):
    """One request waiting in the queue."""

    instances: list[Any]
    enqueued_at: float
    deadline: float | None
    waiter: W
    cancelled: bool = False
    #: Polled before compute: True once the client has gone (an ASGI server's disconnect flag, say).
    gone: Callable[[], bool] | None = None
    #: The request this belongs to (for its id in model logs, and its batch size and queue wait in the request log).
    context: RequestContext | None = field(default_factory=current_request)

    def abandoned(self) -> bool:
        return self.cancelled or (self.gone is not None and self.gone())

    @property
    def size(self) -> int:
        return len(self.instances)


@dataclass
class Batch(Generic[W]):
    """What `BatchQueue.take` hands a driver: requests to compute together, and requests to fail as expired."""

    requests: list[Pending[W]] = field(default_factory=list)
    expired: list[Pending[W]] = field(default_factory=list)
    dropped: list[Pending[W]] = field(default_factory=list)  # cancelled while queued
    #: The traced requests' queue_wait and predict spans, made by `started` (None when tracing is off).
    trace: BatchTrace | None = None

    @property
    def size(self) -> int:
        return sum(r.size for r in self.requests)

    def instances(self) -> list[Any]:
        return [i for r in self.requests for i in r.instances]

    def sizes(self) -> list[int]:
        return [r.size for r in self.requests]

    def abandoned(self, index: int) -> bool:
        """Whether nobody waits for request `index` any more (its client left, or its deadline passed)."""
        request = self.requests[index]
        return request.abandoned() or (request.deadline is not None and request.deadline <= time.monotonic())

    def isolates(self, error: BaseException, max_reruns: int) -> bool:
        """Whether a failure of this whole batch is worth bisecting (see `twinserve.core.isolation`)."""
        return max_reruns > 0 and len(self.requests) > 1 and isolatable(error)

    def started(self, now: float) -> list[str]:
        """Note each request's batch size and queue wait; return their ids, for the model code's context."""
        size, ids = self.size, []
        traced: list[RequestContext] | None = None
        for request in self.requests:
            context = request.context
            if context is not None:
                context.batch_size = size
                context.queue_wait_s = now - request.enqueued_at
                ids.append(context.request_id)
                if context.trace is not None:
                    if traced is None:
                        traced = []
                    traced.append(context)
        if traced is not None:
            self.trace = BatchTrace(traced, ids, size)
        return ids


#: Told of every computed batch: its size, each request's queue wait, compute seconds, instances still queued.
BatchObserver = Callable[[int, list[float], float, int], None]
#: Told of every isolated batch: its requests, how many of them failed, and the predict re-runs it took.
IsolationObserver = Callable[[int, int, int], None]


@dataclass
class BatchStats:
    """Counters a driver keeps, and an optional observer (the metrics layer) told of every batch."""

    batches: int = 0
    instances: int = 0
    expired: int = 0
    cancelled: int = 0
    rejected: int = 0
    isolated: int = 0  # failed batches bisected
    isolation_reruns: int = 0
    isolation_failed: int = 0  # requests that failed alone
    observer: BatchObserver | None = None
    isolation_observer: IsolationObserver | None = None

    def record(self, batch: Batch[Any], started: float, finished: float, queued: int) -> None:
        self.batches += 1
        self.instances += batch.size
        if self.observer is not None:
            waits = [started - r.enqueued_at for r in batch.requests]
            self.observer(batch.size, waits, finished - started, queued)

    def record_isolation(self, batch: Batch[Any], isolated: Isolated) -> None:
        failed = isolated.failed
        self.isolated += 1
        self.isolation_reruns += isolated.reruns
        self.isolation_failed += len(failed)
        ids = [_request_id(batch.requests[i]) for i in failed]
        logger.warning(
            "a batch of %d requests failed; %d predict re-runs isolated %d failing request(s) %s, %d answered",
            len(batch.requests),
            isolated.reruns,
            len(failed),
            ", ".join(ids),
            len(batch.requests) - len(failed),
        )
        if self.isolation_observer is not None:
            self.isolation_observer(len(batch.requests), len(failed), isolated.reruns)


def _request_id(request: Pending[Any]) -> str:
    return request.context.request_id if request.context is not None else "(no id)"


class BatchQueue(Generic[W]):
    """The batching and admission policy. Not thread-safe: each driver serialises access itself."""

    def __init__(self, max_batch_size: int, max_delay: float, max_queue: int, max_in_flight: int) -> None:
        if max_batch_size < 1 or max_delay < 0 or max_queue < 1 or max_in_flight < 1:
            raise ValueError("batch size, queue and in-flight bounds must be >= 1 and the delay >= 0")
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay
        self.max_queue = max_queue
        self.bound = QueueBound(max_queue)
        self.max_in_flight = max_in_flight
        self._queue: deque[Pending[W]] = deque()
        self.queued_instances = 0
        self.in_flight = 0

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, request: Pending[W]) -> None:
        """Admit a request, or raise QueueFull (503) if its instances would overflow the queue bound."""
        self.bound.check(self.queued_instances, request.size, f"the queue holds {self.queued_instances} instances")
        self._queue.append(request)
        self.queued_instances += request.size

    def next_flush_at(self) -> float | None:
        """When the oldest queued request's delay runs out (None if nothing is queued)."""
        if not self._queue:
            return None
        return self._queue[0].enqueued_at + self.max_delay

    def next_deadline(self) -> float | None:
        deadlines = [r.deadline for r in self._queue if r.deadline is not None]
        return min(deadlines) if deadlines else None

    def wake_at(self) -> float | None:
        """When a driver must call `take` again if no request arrives and no batch finishes before then."""
        times = [self.next_deadline()]
        if self.in_flight < self.max_in_flight:
            times.append(self.next_flush_at())
        pending = [t for t in times if t is not None]
        return min(pending) if pending else None

    def take(self, now: float) -> Batch[W] | None:
        """The next batch to compute now, if any; expired and cancelled requests come out with it.

        Returns None when nothing is to be done yet (wait until `next_flush_at` or a new request).
        """
        outcome: Batch[W] = Batch()
        self._drop_dead(now, outcome)
        if self._queue and self.in_flight < self.max_in_flight:
            ready = self.queued_instances >= self.max_batch_size or now >= self._queue[0].enqueued_at + self.max_delay
            if ready:
                while self._queue:
                    head = self._queue[0]
                    # A request larger than a batch goes alone; otherwise never split one across batches.
                    if outcome.requests and outcome.size + head.size > self.max_batch_size:
                        break
                    self._pop()
                    outcome.requests.append(head)
                    if outcome.size >= self.max_batch_size:
                        break
        if outcome.requests:
            self.in_flight += 1
        if outcome.requests or outcome.expired or outcome.dropped:
            return outcome
        return None

    def done(self) -> None:
        """A batch handed out by `take` has finished computing."""
        self.in_flight -= 1

    def drain(self) -> list[Pending[W]]:
        """Everything still queued (for shutdown)."""
        requests = list(self._queue)
        self._queue.clear()
        self.queued_instances = 0
        return requests

    def _pop(self) -> Pending[W]:
        request = self._queue.popleft()
        self.queued_instances -= request.size
        return request

    def _drop_dead(self, now: float, outcome: Batch[W]) -> None:
        if not any(r.abandoned() or (r.deadline is not None and r.deadline <= now) for r in self._queue):
            return
        alive: deque[Pending[W]] = deque()
        for request in self._queue:
            if request.abandoned():
                outcome.dropped.append(request)
            elif request.deadline is not None and request.deadline <= now:
                outcome.expired.append(request)
            else:
                alive.append(request)
        self._queue = alive
        self.queued_instances = sum(r.size for r in alive)


def _gone_error() -> ClientDisconnected:
    return ClientDisconnected("the client closed the connection while the request was queued")


def deadline_passed() -> DeadlineExceeded:
    return DeadlineExceeded("the request's deadline passed before it was computed")


class AsyncBatcher:
    """Asyncio driver: one collector task per model; batches run as tasks, at most `max_in_flight` at once."""

    def __init__(
        self,
        queue: BatchQueue[asyncio.Future[list[Any]]],
        run: Callable[[list[Any]], Awaitable[Any]],
        max_reruns: int = 0,
    ) -> None:
        self.queue = queue
        self.stats = BatchStats()
        self._run = run
        self.max_reruns = max_reruns  # predict re-runs to isolate the failing requests of a batch (0: none)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="twinserve-batcher")

    async def submit(
        self, instances: list[Any], deadline: float | None, gone: Callable[[], bool] | None = None
    ) -> list[Any]:
        """Queue `instances` as one request and wait for their outputs (503 if the queue is full).

        `gone`, if given, tells whether the client has left; such a request is dropped before compute.
        """
        waiter: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        request = Pending(instances, time.monotonic(), deadline, waiter, gone=gone)
        try:
            self.queue.put(request)
        except QueueFull:
            self.stats.rejected += 1
            raise
        self._wake.set()
        try:
            if deadline is None:
                return await request.waiter
            outputs: list[Any] = await asyncio.wait_for(
                asyncio.shield(request.waiter), max(0.0, deadline - time.monotonic())
            )
            return outputs
        except TimeoutError:
            request.cancelled = True  # if still queued it is dropped; if computing, its result is discarded
            self._wake.set()
            raise deadline_passed() from None
        except asyncio.CancelledError:  # the client went away
            request.cancelled = True
            self._wake.set()
            raise

    async def _collect(self) -> None:
        while True:
            now = time.monotonic()
            batch = self.queue.take(now)
            if batch is None:
                self._wake.clear()
                wake_at = self.queue.wake_at()
                timeout = None if wake_at is None else max(0.0, wake_at - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            self.stats.expired += len(batch.expired)
            self.stats.cancelled += len(batch.dropped)
            self._fail(batch.expired, deadline_passed())
            self._fail(batch.dropped, _gone_error())
            if batch.requests:
                task = asyncio.get_running_loop().create_task(self._compute(batch))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _compute(self, batch: Batch[asyncio.Future[list[Any]]]) -> None:
        started = time.monotonic()
        try:
            ids = batch.started(started)
            with computing(ids, batch.trace):
                outcomes = await self._outcomes(batch)
        except TwinserveError as exc:
            self._fail(batch.requests, exc)
        except Exception as exc:  # the executor should have wrapped it; never leave a waiter hanging
            logger.exception("batch of %d request(s) failed unexpectedly", len(batch.requests))
            self._fail(batch.requests, internal_error(exc))
        else:
            for request, outcome in zip(batch.requests, outcomes, strict=True):
                if isinstance(outcome, TwinserveError):
                    self._fail([request], outcome)
                elif not request.waiter.done():
                    request.waiter.set_result(outcome)
        finally:
            self.queue.done()
            self.stats.record(batch, started, time.monotonic(), self.queue.queued_instances)
            self._wake.set()
            self._fail(batch.requests, TwinserveError("batch ended without a result"))

    async def _outcomes(self, batch: Batch[asyncio.Future[list[Any]]]) -> list[Outcome]:
        try:
            return list(split_outputs(batch.sizes(), await self._run(batch.instances())))
        except TwinserveError as exc:
            if not batch.isolates(exc, self.max_reruns):
                raise
            groups = [r.instances for r in batch.requests]
            isolated = await abisect(self._run, groups, exc, self.max_reruns, batch.abandoned)
        self.stats.record_isolation(batch, isolated)
        return isolated.outcomes

    def _fail(self, requests: list[Pending[asyncio.Future[list[Any]]]], exc: Exception) -> None:
        for request in requests:
            if not request.waiter.done():
                request.waiter.set_exception(exc)
                request.waiter.exception()  # mark retrieved: a waiter that timed out will never read it

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)
        self._fail(self.queue.drain(), TwinserveError("the server is shutting down"))


class ThreadBatcher:
    """Thread driver: request threads block on a Future while one collector thread forms and runs batches."""

    def __init__(
        self,
        queue: BatchQueue[concurrent.futures.Future[list[Any]]],
        run: Callable[[list[Any]], Any],
        workers: int,
        max_reruns: int = 0,
    ) -> None:
        self.queue = queue
        self.stats = BatchStats()
        self._run = run
        self.max_reruns = max_reruns  # predict re-runs to isolate the failing requests of a batch (0: none)
        self._cond = threading.Condition()
        self._closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="twinserve-batch")
        self._thread = threading.Thread(target=self._collect, name="twinserve-batcher", daemon=True)
        self._thread.start()

    def submit(self, instances: list[Any], deadline: float | None) -> list[Any]:
        request: Pending[concurrent.futures.Future[list[Any]]] = Pending(
            instances, time.monotonic(), deadline, concurrent.futures.Future()
        )
        with self._cond:
            try:
                self.queue.put(request)
            except QueueFull:
                self.stats.rejected += 1
                raise
            self._cond.notify()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return request.waiter.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._cond:
                request.cancelled = True
                self._cond.notify()
            raise deadline_passed() from None

    def _collect(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    batch = self.queue.take(now)
                    if batch is not None:
                        break
                    wake_at = self.queue.wake_at()
                    self._cond.wait(None if wake_at is None else max(0.0, wake_at - now))
            for request in batch.expired:
                self.stats.expired += 1
                request.waiter.set_exception(deadline_passed())
            self.stats.cancelled += len(batch.dropped)
            for request in batch.dropped:
                if not request.waiter.done():
                    request.waiter.set_exception(_gone_error())
            if batch.requests:
                self._pool.submit(self._compute, batch)

    def _compute(self, batch: Batch[concurrent.futures.Future[list[Any]]]) -> None:
        started = time.monotonic()
        try:
            ids = batch.started(started)
            with computing(ids, batch.trace):
                outcomes = self._outcomes(batch)
        except Exception as exc:
            if isinstance(exc, TwinserveError):
                error = exc
            else:
                logger.exception("batch of %d request(s) failed unexpectedly", len(batch.requests))
                error = internal_error(exc)
            for request in batch.requests:
                if not request.waiter.done():
                    request.waiter.set_exception(error)
        else:
            for request, outcome in zip(batch.requests, outcomes, strict=True):
                if request.waiter.done():
                    continue
                if isinstance(outcome, TwinserveError):
                    request.waiter.set_exception(outcome)
                else:
                    request.waiter.set_result(outcome)
        finally:
            with self._cond:
                self.queue.done()
                self.stats.record(batch, started, time.monotonic(), self.queue.queued_instances)
                self._cond.notify()

    def _outcomes(self, batch: Batch[concurrent.futures.Future[list[Any]]]) -> list[Outcome]:
        try:
            return list(split_outputs(batch.sizes(), self._run(batch.instances())))
        except TwinserveError as exc:
            if not batch.isolates(exc, self.max_reruns):
                raise
            groups = [r.instances for r in batch.requests]
            isolated = bisect(self._run, groups, exc, self.max_reruns, batch.abandoned)
        with self._cond:  # batches may compute on several threads at once
            self.stats.record_isolation(batch, isolated)
        return isolated.outcomes

    def close(self) -> None:
        with self._cond:
            self._closed = True
            leftover = self.queue.drain()
            self._cond.notify()
        for request in leftover:
            request.waiter.set_exception(TwinserveError("the server is shutting down"))
        self._pool.shutdown(wait=True)
