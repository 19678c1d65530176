"""One load level in progress (`LevelRun`): its clock, the closed-loop and open-loop drivers that hand requests to
connections, the generator's own CPU, and the `LevelResult` it comes to.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import deque
from collections.abc import Coroutine, Iterator
from typing import Any

from twinserve.lab.loadgen.connection import ArrivalClock, Connection
from twinserve.lab.loadgen.http import Endpoint
from twinserve.lab.loadgen.spec import LoadSpec
from twinserve.lab.loadgen.tally import LevelResult, Outcome, Tally

__all__ = ["CPU_LIMIT_PERCENT", "RATE_SHORTFALL", "RETRIED_STATUSES", "LevelRun", "arrival_times"]

#: The generator is one event-loop thread: at this share of one core it is probably the bottleneck.
CPU_LIMIT_PERCENT = 90.0
#: Open loop: sending this share fewer requests than were due, with connections to spare, means the generator lagged.
RATE_SHORTFALL = 0.05
#: The answers a retrying client (`LoadSpec.retries`) sends its request again after.
RETRIED_STATUSES = frozenset({429, 503})


def arrival_times(start: float, rate: float, arrivals: str, seed: int) -> Iterator[float]:
    """The moments requests fall due, from `start`: a Poisson process (exponential gaps of mean 1/rate, seeded)
    or evenly spaced. Each request's latency counts from its moment here, not from when it could be sent."""
    rng = random.Random(seed)
    due = start
    while True:
        yield due
        due += rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate


async def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


class LevelRun:
    """One level in progress: its clock, connections and tally.

    Every exchange ends in `complete`, called from the connection's own callbacks, which records it and at once
    hands the connection its next request: in closed loop a fresh one, in open loop the oldest one waiting.
    """

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        endpoint = Endpoint.parse(spec.url, spec.remote)
        self._address, self._port = endpoint.address, endpoint.port
        self._requests = itertools.cycle(endpoint.requests(spec.headers, spec.bodies))
        self._timeout_s = spec.timeout_s
        self._retries = spec.retries
        self._closed_loop = spec.concurrency is not None
        self._tally = Tally()
        self._connections: list[Connection] = []
        self._start = time.perf_counter()
        self._window_start = self._start + spec.warmup_s
        self._window_end = self._window_start + spec.duration_s
        self._tasks: asyncio.TaskGroup | None = None
        loop = asyncio.get_running_loop()
        self._clock = ArrivalClock(loop)
        self._finished: asyncio.Future[None] = loop.create_future()
        self._active = 0  # connections with an exchange in progress or a connect pending
        self._idle: deque[Connection] = deque()  # open loop: connections waiting for a request to fall due
        self._backlog: deque[float] = deque()  # open loop: due times waiting for a connection
        self._scheduled_all = False
        self._pool_exhausted = False

    async def run(self) -> LevelResult:
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                cpu = tasks.create_task(self._cpu_percent())
                if self.spec.concurrency is not None:
                    for _ in range(self.spec.concurrency):
                        self._take_up(self._connect(), time.perf_counter())
                else:
                    tasks.create_task(self._schedule())
                await self._finished
        finally:
            await asyncio.gather(*(connection.aclose() for connection in self._connections))
        return self._result(cpu.result())

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        assert self._tasks is not None
        self._tasks.create_task(coroutine)

    def complete(self, connection: Connection, outcome: Outcome, finished: float, code: bytes | None = None) -> None:
        """Record the exchange `connection` just finished (`code`: an error answer's code from its body), and hand
        it its next request."""
        try:
            self._active -= 1
            if self._retries and self._retry(connection, outcome):
                return
            due = connection.due
            if self._window_start <= due < self._window_end:
                self._tally.record(outcome, due, connection.sent_at, finished, self._window_end, code)
            if isinstance(outcome, int) and 200 <= outcome < 300 and self._window_start <= finished < self._window_end:
                self._tally.ok_in_window += 1  # whenever it fell due: the server's answers within the window
            if self._closed_loop:
                now = time.perf_counter()
                if now < self._window_end:
                    self._take_up(connection, now)
            else:
                self._take_up_backlog(connection)
            if self._active == 0 and (self._closed_loop or self._scheduled_all) and not self._finished.done():
                self._finished.set_result(None)
        except Exception as error:  # raised from a protocol callback, it would only be logged, and the run never end
            if not self._finished.done():
                self._finished.set_exception(error)

    def _connect(self) -> Connection:
        connection = Connection(self, self._address, self._port, self._clock)
        self._connections.append(connection)
        return connection

    def _retry(self, connection: Connection, outcome: Outcome) -> bool:
        """Send a refused request again at once, as a client that ignores Retry-After does; False when it is not
        to be retried (another answer, its retries spent, its deadline passed)."""
        if outcome not in RETRIED_STATUSES or connection.retried >= self._retries:
            return False
        due, first_sent = connection.due, connection.sent_at
        now = time.perf_counter()
        if now >= due + self._timeout_s:
            return False
        connection.retried += 1
        if self._window_start <= due < self._window_end:
            self._tally.retries += 1
        self._active += 1
        connection.send(connection.request, due, now, due + self._timeout_s)
        connection.sent_at = first_sent  # its service time, too, runs from its first send
        return True

    def _take_up(self, connection: Connection, due: float) -> bool:
        """Send the request due at `due` over `connection`; False where its deadline has passed, and it never went."""
        now = time.perf_counter()
        deadline = due + self._timeout_s
        if now >= deadline:  # it waited out its whole deadline for a connection
            if self._window_start <= due < self._window_end:
                self._tally.record("unsent", due, None, now, self._window_end)
            return False
        self._active += 1
        connection.retried = 0
        connection.send(next(self._requests), due, now, deadline)
        return True

    def _take_up_backlog(self, connection: Connection) -> None:
        """Open loop: send the oldest request still waiting over `connection`, or let it wait for the next one."""
        while self._backlog:
            if self._take_up(connection, self._backlog.popleft()):
                return
        self._idle.append(connection)

    async def _schedule(self) -> None:
        """Open loop: take up each request when it falls due; add a connection when none is idle."""
        rate = self.spec.rate
        assert rate is not None
        for due in arrival_times(self._start, rate, self.spec.arrivals, self.spec.seed):
            if due >= self._window_end:
                break
            await _sleep_until(due)
            if self._idle or len(self._connections) < self.spec.max_connections:
                connection = self._idle.popleft() if self._idle else self._connect()
                if not self._take_up(connection, due):  # the loop stalled past its deadline: keep the connection
                    self._idle.appendleft(connection)
            else:
                self._backlog.append(due)
                if due >= self._window_start:
                    self._pool_exhausted = True
        self._scheduled_all = True
        if self._active == 0 and not self._finished.done():
            self._finished.set_result(None)

    async def _cpu_percent(self) -> float:
        """This thread's CPU over the window, as a percentage of one core."""
        await _sleep_until(self._window_start)
        cpu, wall = time.thread_time(), time.perf_counter()
        await _sleep_until(self._window_end)
        return 100.0 * (time.thread_time() - cpu) / max(time.perf_counter() - wall, 1e-9)

    def _result(self, cpu_percent: float) -> LevelResult:
        spec, tally = self.spec, self._tally
        open_loop = spec.rate is not None
        lagged = open_loop and not self._pool_exhausted and tally.sent_in_window < (1 - RATE_SHORTFALL) * tally.sent
        return LevelResult(
            mode="open" if open_loop else "closed",
            concurrency=spec.concurrency,
            rate=spec.rate,
            achieved_rate=tally.sent_in_window / spec.duration_s if open_loop else None,
            duration_s=spec.duration_s,
            sent=tally.sent,
            ok=tally.ok,
            http_errors=dict(sorted(tally.http_errors.items())),
            transport_errors=dict(tally.transport_errors),
            throughput_rps=(tally.ok + tally.http_errors.total()) / spec.duration_s,
            latency_ms=tally.latency.summary(),
            service_time_ms=tally.service.summary(),
            generator_cpu_percent=round(cpu_percent, 1),
            generator_limited=cpu_percent >= CPU_LIMIT_PERCENT or lagged,
            connections_used=len(self._connections),
            pool_exhausted=self._pool_exhausted,
            retries=tally.retries,
            ok_in_window=tally.ok_in_window,
            http_error_codes=tally.error_codes(),
        )
