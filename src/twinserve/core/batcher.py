"""Dynamic batching: the pure policy over a queue (`core/batch_queue.py`), driven by an asyncio or a thread driver.

`BatchQueue` decides what to flush, when, and what to admit, from the queue and a clock reading passed in.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from twinserve.core.batch_queue import Batch, BatchQueue, Pending
from twinserve.core.isolation import Isolated, Outcome, abisect, bisect, split_outputs
from twinserve.errors import ClientDisconnected, DeadlineExceeded, QueueFull, TwinserveError, internal_error
from twinserve.observability.context import computing

__all__ = ["AsyncBatcher", "Batch", "BatchQueue", "BatchStats", "Pending", "ThreadBatcher", "deadline_passed"]

logger = logging.getLogger("twinserve.batcher")

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


#: Answers handed back to their requests in one turn of the event loop. Each answer is a step of its request's
#: task (encode, write, log) on the loop's next turn; a whole batch's at once makes a long turn during which no
#: connection is read, so a high-priority request arriving then would wait for all of them before being parsed.
#: A batch is filled from the highest level down, so its answers come first.
ANSWER_CHUNK = 8


def _request_id(request: Pending[Any]) -> str:
    return request.context.request_id if request.context is not None else "(no id)"


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
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[Any]] = loop.create_future()
        request = Pending(instances, time.monotonic(), deadline, waiter, gone=gone)
        try:
            self.queue.put(request)
        except (QueueFull, DeadlineExceeded):
            self.stats.rejected += 1
            raise
        self._wake.set()
        # The deadline is a timer that fails this one future: no task, no shield, no second future per request.
        timer = (
            None if deadline is None else loop.call_later(max(0.0, deadline - time.monotonic()), self._expire, request)
        )
        try:
            return await waiter
        except asyncio.CancelledError:  # the client went away
            request.cancelled = True
            self._wake.set()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, request: Pending[asyncio.Future[list[Any]]]) -> None:
        """The request's deadline passed before it was answered: 504; if still queued it is dropped, if computing
        its result is discarded."""
        if request.waiter.done():
            return
        request.cancelled = True
        request.waiter.set_exception(deadline_passed())
        self._wake.set()

    async def _collect(self) -> None:
        while True:
            now = time.monotonic()
            batch = self.queue.take(now)
            if batch is None:
                self._wake.clear()
                wake_at = self.queue.wake_at()
                timeout = None if wake_at is None else max(0.0, wake_at - now)
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes as the event is set
                # (it returns the event's result), and `close` then waits for the whole timeout.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
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
        finished: float | None = None
        try:
            ids = batch.started(started)
            with computing(ids, batch.trace):
                outcomes = await self._outcomes(batch)
            finished = time.monotonic()
        except TwinserveError as exc:
            self._fail(batch.requests, exc)
        except Exception as exc:  # the executor should have wrapped it; never leave a waiter hanging
            logger.exception("batch of %d request(s) failed unexpectedly", len(batch.requests))
            self._fail(batch.requests, internal_error(exc))
        else:
            for index, (request, outcome) in enumerate(zip(batch.requests, outcomes, strict=True)):
                if index and not index % ANSWER_CHUNK:
                    await asyncio.sleep(0)  # the answers set so far are written before the rest: see ANSWER_CHUNK
                if isinstance(outcome, TwinserveError):
                    self._fail([request], outcome)
                elif not request.waiter.done():
                    request.waiter.set_result(outcome)
        finally:
            finished = time.monotonic() if finished is None else finished
            self.queue.done(finished - started)
            self.stats.record(batch, started, finished, self.queue.queued_instances)
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
            except (QueueFull, DeadlineExceeded):
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
            finished = time.monotonic()
            with self._cond:
                self.queue.done(finished - started)
                self.stats.record(batch, started, finished, self.queue.queued_instances)
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
