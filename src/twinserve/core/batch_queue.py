"""The batching policy over one model's queue: what to flush, when, and what to admit. Pure: a clock reading in,
a decision out; it never sleeps, locks or touches a future, so its decisions are unit-tested directly.

A batch is flushed when full (`max_batch_size`), when its oldest request has waited `max_delay`, and only while
fewer than `max_in_flight` batches compute. Expired and cancelled requests are swept out before compute, lazily
(`SWEEP_S`), so `take` need not look at every queued request on every arrival. Each priority level (1 is the
highest, as in Triton) has its own lane and share of the bound, so overload refuses the lowest level first. A
request that would still be waiting when its deadline passes is refused at once (504 `deadline_unmeetable`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from twinserve.core.admission import QueueBound
from twinserve.core.isolation import isolatable
from twinserve.errors import DeadlineUnmeetable
from twinserve.observability.context import RequestContext, current_request
from twinserve.observability.tracing import BatchTrace

__all__ = ["SWEEP_S", "Batch", "BatchQueue", "Pending"]

W = TypeVar("W")  # the driver's waiter: an asyncio.Future or a concurrent.futures.Future

#: Batches measured before the queue trusts its estimate of a batch's duration.
_WARM_BATCHES = 3
#: Weight of the newest batch in the moving average of batch durations.
_SMOOTHING = 0.2
#: Longest time between two looks over the whole queue for requests whose client has gone (see the module's doc).
SWEEP_S = 0.025


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

    @property
    def priority(self) -> int:
        """The request's priority level (1 is the highest), as its exchange admitted it."""
        return self.context.priority if self.context is not None else 1


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


class BatchQueue(Generic[W]):
    """The batching and admission policy. Not thread-safe: each driver serialises access itself."""

    def __init__(
        self,
        max_batch_size: int,
        max_delay: float,
        max_queue: int,
        max_in_flight: int,
        levels: int = 1,
        max_wait: float = 0.0,
    ) -> None:
        if max_batch_size < 1 or max_delay < 0 or max_queue < 1 or max_in_flight < 1:
            raise ValueError("batch size, queue and in-flight bounds must be >= 1 and the delay >= 0")
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay
        self.max_queue = max_queue
        self.max_in_flight = max_in_flight
        self.bound = QueueBound(max_queue, levels, max_wait)
        #: One lane per priority level, the highest (1) first.
        self._lanes: list[deque[Pending[W]]] = [deque() for _ in range(levels)]
        #: Instances queued per lane.
        self._sizes = [0] * levels
        self.queued_instances = 0
        self.in_flight = 0
        #: Moving average of a batch's compute seconds (None before the first is measured).
        self.batch_seconds: float | None = None
        self._measured = 0
        #: The earliest deadline queued, or earlier (one whose request has left since): a look is due by then.
        self._earliest_deadline = math.inf
        self._swept_at = -math.inf

    @property
    def crowded(self) -> bool:
        """Whether the queue holds its lowest level's share of the bound or more: below it, every level may put
        one more instance, so no refusal can come (a cheap test before `QueueBound.check`)."""
        return self.queued_instances >= self.bound.lowest_limit

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes)

    def _lane(self, priority: int) -> int:
        return min(max(priority, 1), len(self._lanes)) - 1

    def put(self, request: Pending[W], now: float | None = None) -> None:
        """Admit a request: QueueFull (503) past its level's share of the queue bound, DeadlineUnmeetable (504)
        when the work queued ahead of it would outlast its deadline."""
        lane, size, bound = self._lane(request.priority), request.size, self.bound
        queued = self.queued_instances
        # Within its level's share of the count bound a request is admitted whatever the wait ahead; past it, the
        # wait decides. So the wait is estimated only then or for a deadline, and the bound checked only then.
        over = queued + size > bound.limit_for(lane + 1)
        wait = self.expected_wait(size, lane + 1) if over or request.deadline is not None else None
        if over:
            bound.check(queued, size, f"the queue holds {queued} instances", lane + 1, wait)
        if request.deadline is not None:
            now = time.monotonic() if now is None else now
            if wait is not None and now + wait > request.deadline:
                raise DeadlineUnmeetable(
                    f"the work queued ahead would take about {wait * 1000:.0f} ms, past the request's deadline "
                    f"in {max(0.0, request.deadline - now) * 1000:.0f} ms; send a longer X-Request-Timeout-Ms "
                    "or retry later"
                )
        self._lanes[lane].append(request)
        self._sizes[lane] += size
        self.queued_instances += size
        if request.deadline is not None and request.deadline < self._earliest_deadline:
            self._earliest_deadline = request.deadline

    def expected_wait(self, size: int, priority: int = 1) -> float | None:
        """Seconds until a new request of `size` instances at `priority` would have been computed, from the work
        at its level and above and the measured batch duration; None until batches have been measured."""
        seconds = self.batch_seconds
        if seconds is None or self._measured < _WARM_BATCHES:
            return None
        ahead = sum(self._sizes[: self._lane(priority) + 1]) + size
        waves = math.ceil(math.ceil(ahead / self.max_batch_size) / self.max_in_flight)
        if self.in_flight >= self.max_in_flight:
            waves += 1  # every slot is busy: the running batches finish first
        return waves * seconds

    def next_flush_at(self) -> float | None:
        """When the oldest queued request's delay runs out (None if nothing is queued)."""
        oldest = [lane[0].enqueued_at for lane in self._lanes if lane]
        return min(oldest) + self.max_delay if oldest else None

    def next_deadline(self) -> float | None:
        """The earliest deadline queued (or earlier: a driver woken by one whose request has left finds nothing
        to do, and the look it triggers brings this up to date)."""
        return None if self._earliest_deadline == math.inf else self._earliest_deadline

    def wake_at(self) -> float | None:
        """When a driver must call `take` again if no request arrives and no batch finishes before then."""
        times = [self.next_deadline()]
        if self.in_flight < self.max_in_flight:
            times.append(self.next_flush_at())
        pending = [t for t in times if t is not None]
        return min(pending) if pending else None

    def take(self, now: float) -> Batch[W] | None:
        """The next batch to compute now, if any, filled from the highest priority first; expired and cancelled
        requests come out with it. Returns None when nothing is to be done yet (wait until `wake_at`)."""
        outcome: Batch[W] = Batch()
        if now >= self._earliest_deadline or now - self._swept_at >= SWEEP_S:
            self._drop_dead(now, outcome)
        flush_at = self.next_flush_at()
        due = flush_at is not None and (self.queued_instances >= self.max_batch_size or now >= flush_at)
        if due and self.in_flight < self.max_in_flight:
            self._fill(outcome, now)
        if outcome.requests:
            self.in_flight += 1
        if outcome.requests or outcome.expired or outcome.dropped:
            return outcome
        return None

    def _fill(self, outcome: Batch[W], now: float) -> None:
        size = 0
        for index, lane in enumerate(self._lanes):
            while lane:
                head = lane[0]
                # A request larger than a batch goes alone; otherwise never split one across batches.
                if outcome.requests and size + head.size > self.max_batch_size:
                    return
                lane.popleft()
                self._sizes[index] -= head.size
                self.queued_instances -= head.size
                fate = _dead_end(head, now, outcome)
                if fate is not None:  # gone since the last look over the queue: never computed
                    fate.append(head)
                    continue
                outcome.requests.append(head)
                size += head.size
                if size >= self.max_batch_size:
                    return

    def done(self, seconds: float | None = None) -> None:
        """A batch handed out by `take` has finished computing, in `seconds` (when measured)."""
        self.in_flight -= 1
        if seconds is not None:
            self._measured += 1
            average = self.batch_seconds
            self.batch_seconds = seconds if average is None else average + _SMOOTHING * (seconds - average)

    def drain(self) -> list[Pending[W]]:
        """Everything still queued (for shutdown)."""
        requests = [r for lane in self._lanes for r in lane]
        for lane in self._lanes:
            lane.clear()
        self._sizes = [0] * len(self._lanes)
        self.queued_instances = 0
        self._earliest_deadline = math.inf
        return requests

    def _drop_dead(self, now: float, outcome: Batch[W]) -> None:
        """Take every abandoned or expired request out of the queue (the look over it `take` makes when due)."""
        self._swept_at, earliest = now, math.inf
        for index, lane in enumerate(self._lanes):
            alive: deque[Pending[W]] = deque()
            for request in lane:
                fate = _dead_end(request, now, outcome)
                if fate is not None:
                    fate.append(request)
                    continue
                alive.append(request)
                if request.deadline is not None and request.deadline < earliest:
                    earliest = request.deadline
            if len(alive) < len(lane):
                self._lanes[index] = alive
                self._sizes[index] = sum(r.size for r in alive)
        self.queued_instances = sum(self._sizes)
        self._earliest_deadline = earliest


def _dead_end(request: Pending[W], now: float, outcome: Batch[W]) -> list[Pending[W]] | None:
    """Where a request nobody waits for any more goes instead of a batch: `outcome.dropped` (its client has gone),
    `outcome.expired` (its deadline has passed); None while it is awaited."""
    if request.abandoned():
        return outcome.dropped
    if request.deadline is not None and request.deadline <= now:
        return outcome.expired
    return None
