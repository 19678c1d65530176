"""The lab's load generator: closed- or open-loop HTTP/1.1 load on a loopback server, measured honestly.

Closed loop: `concurrency` keep-alive connections, each sending its next request as soon as the last is answered.

Open loop: requests fall due at `rate` per second (Poisson or evenly spaced arrivals) whether or not the server keeps
up, and go out over a pool of connections that grows on demand up to `max_connections`. When the pool is exhausted a
request waits for a free connection, yet its `latency` still counts from the moment it fell due (the
coordinated-omission correction); its `service_time` counts from when a connection took it up.

Only requests that fall due inside the measured window count; those still in flight when it ends may finish, each
within `timeout_s` of falling due, after which it counts as a `timeout` (or, if it never got a connection, as
`unsent`). Event-loop timers tick in milliseconds,
so open-loop latency may carry up to about a millisecond of the scheduler's own slack; service time does not.

The client is a minimal HTTP/1.1 one, so that the generator, one thread, is rarely the limit: a bare asyncio protocol
driven by callbacks, with every request encoded up front, each next request sent from the callback that read the last
response, and responses timed from when the event loop learned they had arrived (`_ArrivalClock`) rather than from
when their callback's turn came. When the generator may have been the limit, the result says so (`generator_limited`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import random
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from hdrh.histogram import HdrHistogram

__all__ = ["LevelResult", "LoadSpec", "run_level", "run_level_sync"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})
#: `unsent`: an open-loop request that waited out its whole timeout for a free connection, so never reached the server.
TRANSPORT_ERROR_KINDS = ("connect_refused", "reset", "timeout", "unsent", "other")
#: Summary key -> percentile, for both latency and service time.
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
HISTOGRAM_MAX_US = 60_000_000
#: A response head, chunk-size line or trailer field longer than this is malformed.
MAX_HEAD_BYTES = 1 << 16
#: The shortest wait on a deadline timer; timeouts may read up to this late.
TIMER_TICK_S = 0.001
#: The generator is one event-loop thread: at this share of one core it is probably the bottleneck.
CPU_LIMIT_PERCENT = 90.0
#: Open loop: sending this share fewer requests than were due, with connections to spare, means the generator lagged.
RATE_SHORTFALL = 0.05
#: Framing headers the client writes itself.
_RESERVED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})
#: The response fields that frame it, in a lower-cased head; one pass over the head finds them all.
_FRAMING_FIELDS = re.compile(rb"\r\n(content-length|transfer-encoding|connection):[ \t]*([^\r]*)")

Outcome = int | str  # an HTTP status code, or one of TRANSPORT_ERROR_KINDS


@dataclass(frozen=True)
class LoadSpec:
    """One load level: POST `bodies` (round-robin) to `url`, in closed loop (`concurrency`) or open loop (`rate`).

    `warmup_s` of load is discarded before `duration_s` is measured. `max_connections` caps the open-loop pool;
    `timeout_s` bounds each request from the moment it falls due. `seed` makes Poisson arrivals repeatable.
    """

    url: str
    bodies: Sequence[bytes]
    duration_s: float
    warmup_s: float = 0.0
    concurrency: int | None = None
    rate: float | None = None
    arrivals: Literal["poisson", "constant"] = "poisson"
    max_connections: int = 512
    timeout_s: float = 30.0
    headers: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be a positive number of requests per second, not {self.rate}")
        for name in ("duration_s", "timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, not {value}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"warmup_s must be zero or more, not {self.warmup_s}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if self.arrivals not in ("poisson", "constant"):
            raise ValueError(f"arrivals must be 'poisson' or 'constant', not {self.arrivals!r}")
        if not self.bodies or not all(isinstance(body, bytes) for body in self.bodies):
            raise ValueError("bodies must be a non-empty sequence of bytes")
        for name, value in self.headers.items():
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"the load generator sets the {name} header itself")
            if any(c in name + value for c in "\r\n") or ":" in name:
                raise ValueError(f"malformed header {name!r}: {value!r}")
        _Endpoint.parse(self.url)


@dataclass
class LevelResult:
    """What one load level measured; latencies in milliseconds, `None` where no response came back.

    `sent` counts requests that fell due in the window; `sent == ok + sum(http_errors) + sum(transport_errors)`.
    `latency_ms` counts from when a request fell due, `service_time_ms` from when a connection took it up; both
    cover every HTTP response, error statuses included. `throughput_rps` is responses per measured second.
    `achieved_rate` (open loop) is requests actually sent within the window per second. `pool_exhausted` says
    requests had to queue for a connection, so the server, not the generator, set the pace.
    """

    mode: Literal["closed", "open"]
    concurrency: int | None
    rate: float | None
    achieved_rate: float | None
    duration_s: float
    sent: int
    ok: int
    http_errors: dict[str, int]
    transport_errors: dict[str, int]
    throughput_rps: float
    latency_ms: dict[str, float | None]
    service_time_ms: dict[str, float | None]
    generator_cpu_percent: float
    generator_limited: bool
    connections_used: int
    pool_exhausted: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_level(spec: LoadSpec) -> LevelResult:
    """Drive one level on the running event loop; returns once the window and its stragglers are done."""
    return await _Run(spec).run()


def run_level_sync(spec: LoadSpec) -> LevelResult:
    """`run_level` on an event loop of its own (uvloop when installed)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(run_level(spec))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


@dataclass(frozen=True)
class _Endpoint:
    port: int
    authority: str
    target: str

    @classmethod
    def parse(cls, url: str) -> _Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"the load generator speaks plain http:// only, not {url!r}")
        if parts.hostname not in LOOPBACK_HOSTS:
            raise ValueError(f"the load generator drives loopback servers only (127.0.0.1 or localhost), not {url!r}")
        port = parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(port, f"{parts.hostname}:{port}", target)

    def requests(self, spec: LoadSpec) -> list[bytes]:
        """Every distinct request of the level, encoded once."""
        headers = {"host": ("Host", self.authority), "content-type": ("Content-Type", "application/json")}
        headers.update((name.lower(), (name, value)) for name, value in spec.headers.items())
        head = f"POST {self.target} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.values())
        return [f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body for body in spec.bodies]


#: Parser states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE, _DONE = range(7)


class _ResponseParser:
    """Sans-IO framing of HTTP/1.x responses: `feed` it bytes as they come and it says when a response is whole.

    Interim (1xx) responses are skipped; bodies are counted, not kept.
    """

    __slots__ = ("_buffer", "_remaining", "_state", "keep_alive", "status")

    def __init__(self) -> None:
        self._buffer = b""
        self._state = _HEAD
        self._remaining = 0
        self.status = 0
        self.keep_alive = True

    @property
    def between_responses(self) -> bool:
        """Nothing of the next response read yet."""
        return self._state == _HEAD and not self._buffer

    @property
    def ends_at_close(self) -> bool:
        """The body runs to the end of the connection, so the connection closing completes it."""
        return self._state == _UNTIL_CLOSE

    def feed(self, data: bytes) -> bool:
        """Take in the next bytes; True once they complete the response, whose `status` and `keep_alive` then hold.

        Raises ValueError where the bytes are not an HTTP/1.x response.
        """
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        pos, size, state = 0, len(data), self._state
        while state != _DONE:
            if state in (_LENGTH, _CHUNK_DATA):
                take = min(self._remaining, size - pos)
                pos += take
                self._remaining -= take
                if self._remaining:
                    break
                state = _DONE if state == _LENGTH else _CHUNK_SIZE
            elif state == _UNTIL_CLOSE:
                break
            else:
                end = data.find(b"\r\n\r\n" if state == _HEAD else b"\r\n", pos)
                if end < 0:
                    if size - pos > MAX_HEAD_BYTES:
                        raise ValueError(f"no end to a response line or head in {MAX_HEAD_BYTES} bytes")
                    self._buffer = data[pos:]
                    break
                if state == _HEAD:
                    status, keep_alive, state, self._remaining = _framing(data[pos : end + 2])
                    if state != _HEAD:  # else an interim (1xx) response, skipped
                        self.status, self.keep_alive = status, keep_alive
                    pos = end + 4
                    continue
                line, pos = data[pos:end], end + 2
                if state == _TRAILER:
                    state = _TRAILER if line else _DONE
                    continue
                self._remaining = int(line.split(b";", 1)[0], 16)
                if self._remaining < 0:
                    raise ValueError(f"negative chunk size {line!r}")
                state = _CHUNK_DATA if self._remaining else _TRAILER
                self._remaining += 2  # the chunk's closing CRLF
        if state != _DONE:
            self._state = state
            return False
        if pos < size:  # bytes beyond the response that no request asked for: the framing is lost
            self.keep_alive = False
        self._state = _HEAD
        return True


@functools.lru_cache(maxsize=256)
def _framing(head: bytes) -> tuple[int, bool, int, int]:
    """A response head's (through its last field's CRLF) status, keep-alive, the parser state that follows, and the
    body length where that state is `_LENGTH`.

    Cached, since a server sends the same few heads again and again; what varies, like a Date field, varies slowly.
    """
    if not head.startswith(b"HTTP/1.") or head[12:13] not in (b" ", b"\r"):
        raise ValueError(f"not an HTTP/1.x status line: {head[:40]!r}")
    status = int(head[9:12])
    if 100 <= status < 200:
        return status, True, _HEAD, 0
    fields = dict(_FRAMING_FIELDS.findall(head.lower()))
    connection = fields.get(b"connection", b"")
    keep_alive = b"close" not in connection if head.startswith(b"HTTP/1.1") else b"keep-alive" in connection
    if status in (204, 304):
        return status, keep_alive, _DONE, 0
    if b"chunked" in fields.get(b"transfer-encoding", b""):
        return status, keep_alive, _CHUNK_SIZE, 0
    if length := fields.get(b"content-length"):
        if (size := int(length)) < 0:
            raise ValueError(f"negative content-length {length!r}")
        return status, keep_alive, _LENGTH if size else _DONE, size
    return status, False, _UNTIL_CLOSE, 0


class _ArrivalClock:
    """Times responses from when the event loop learned they had arrived, not from when their turn came.

    The loop hands a batch of ready sockets to their protocols one after another, and a Python callback costs tens of
    microseconds: timed in its own turn, the last response of a burst of 64 would read a millisecond or more late.
    Every socket of a batch was already readable when the loop began to serve it, so the first reading of the batch,
    which a callback queued behind the batch clears, bounds each of their arrivals from above. That holds for a
    response read whole in one chunk; one that came in pieces may have had its last piece land during the batch, so
    it is timed on the spot instead.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._batch_began: float | None = None

    def arrived(self, whole: bool) -> float:
        """When the response just read had arrived, at the latest; `whole`: it came in the one chunk just read."""
        if not whole:
            return time.perf_counter()
        if self._batch_began is None:
            self._batch_began = time.perf_counter()
            self._loop.call_soon(self._end_batch)
        return self._batch_began

    def _end_batch(self) -> None:
        self._batch_began = None


class _Wire(asyncio.Protocol):
    """One TCP connection: writes a request, frames the response as it arrives, and reports to its slot at once.

    A bare protocol rather than asyncio streams, and callbacks rather than futures: no reader buffer, no per-read
    futures, no task switch between a response and the next request, which goes out from the very callback that
    read the response's last bytes. The response is timed by the run's `_ArrivalClock`.
    """

    def __init__(self, slot: _Connection) -> None:
        self._slot = slot
        self._transport: asyncio.Transport | None = None
        self._parser = _ResponseParser()
        self._busy = False
        self._closing = False
        self.lost: asyncio.Future[None] = slot.loop.create_future()

    @property
    def idle(self) -> bool:
        """Open, with no exchange in progress: ready for the next request."""
        return not self._busy and not self._closing

    @property
    def busy(self) -> bool:
        return self._busy

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def send(self, request: bytes) -> None:
        assert self._transport is not None and self.idle
        self._busy = True
        self._transport.write(request)

    def data_received(self, data: bytes) -> None:
        if not self._busy:  # bytes no request asked for: the framing is lost
            self._close()
            return
        whole = self._parser.between_responses
        try:
            done = self._parser.feed(data)
        except ValueError as error:
            self.fail(error)
            return
        if done:
            finished = self._slot.clock.arrived(whole)
            self._busy = False
            if not self._parser.keep_alive:
                self._close()
            self._slot.on_response(self._parser.status, finished)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(None)
        self._closing = True
        if self._busy and self._parser.ends_at_close:
            self._busy = False
            self._slot.on_response(self._parser.status, time.perf_counter())
        self.fail(exc or ConnectionResetError("the server closed the connection mid-response"))

    def fail(self, error: Exception) -> None:
        """Close the connection; if an exchange was in progress, it failed with `error`."""
        self._close()
        if self._busy:
            self._busy = False
            self._slot.on_failure(error)

    def abandon(self) -> None:
        """Close the connection without a word to the slot."""
        self._busy = False
        self._close()

    def _close(self) -> None:
        if not self._closing:
            self._closing = True
            if self._transport is not None:
                self._transport.abort()


class _Connection:
    """One connection slot of a run: sends the requests it is handed, one at a time, and tells the run each outcome.

    Any failure closes its connection, and the next request opens a fresh one. Deadlines share one timer per slot,
    re-armed lazily: a slot's deadlines mostly come later than the one its timer is set for, so when that timer fires
    with the exchange in progress not yet due, it is set again for that exchange's deadline, rather than one timer
    being made and cancelled per request.
    """

    def __init__(self, run: _Run, port: int, clock: _ArrivalClock) -> None:
        self._run = run
        self._port = port
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self._wire: _Wire | None = None
        self._deadline = 0.0  # of the exchange in progress
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0.0  # the deadline the timer was set for
        #: The exchange in progress: when it fell due and when it went out (`time.perf_counter` readings).
        self.due = self.sent_at = 0.0

    def send(self, request: bytes, due: float, now: float, deadline: float) -> None:
        """Send `request`, due at `due`, now; its outcome comes back through the run, by `deadline` at the latest."""
        self.due, self.sent_at = due, now
        wire = self._wire
        if wire is not None and wire.idle:
            self._arm(deadline, now)
            wire.send(request)
        else:
            self.close()
            self._run.spawn(self._connect_and_send(request, deadline))

    async def _connect_and_send(self, request: bytes, deadline: float) -> None:
        loop = self.loop
        try:
            async with asyncio.timeout(deadline - time.perf_counter()):
                # The literal address, even for "localhost": no resolver call per connection, no IPv6 detour.
                _, wire = await loop.create_connection(lambda: _Wire(self), "127.0.0.1", self._port)
        except OSError as error:
            self.on_failure(error)
            return
        self._wire = wire
        self._arm(deadline, time.perf_counter())
        wire.send(request)

    def on_response(self, status: int, finished: float) -> None:
        self._run.complete(self, status, finished)

    def on_failure(self, error: Exception) -> None:
        self._run.complete(self, _outcome(error), time.perf_counter())

    def _arm(self, deadline: float, now: float) -> None:
        self._deadline = deadline
        if self._timer is None or self._timer_deadline > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._set_timer(deadline, now)

    def _set_timer(self, deadline: float, now: float) -> None:
        self._timer_deadline = deadline
        # uvloop's timers tick in milliseconds and may fire up to one early: a shorter wait would spin on a near miss.
        self._timer = self.loop.call_later(max(deadline - now, TIMER_TICK_S), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        wire = self._wire
        if wire is None or not wire.busy:
            return  # idle: the next exchange arms it again
        now = time.perf_counter()
        if now >= self._deadline:
            wire.fail(TimeoutError())
        else:
            self._set_timer(self._deadline, now)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._wire is not None:
            self._wire.abandon()
            self._wire = None

    async def aclose(self) -> None:
        wire = self._wire
        self.close()
        if wire is not None:
            await wire.lost


def _outcome(error: Exception) -> str:
    """The transport error kind `error` counts as."""
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionRefusedError):
        return "connect_refused"
    if isinstance(error, ConnectionError):
        return "reset"
    return "other"


class _Histogram:
    """An HdrHistogram of microseconds, fed through a dict of exact counts.

    hdrh buckets each value in pure Python, about 1.5 µs a value; a dict update is a tenth of that. The dict is
    folded into the histogram whenever it grows large, and before any reading. The mean comes from an exact sum, not
    from hdrh, which walks every bucket for it.
    """

    FOLD_AT = 1 << 16

    def __init__(self) -> None:
        self._hdr = HdrHistogram(1, HISTOGRAM_MAX_US, 3)
        self._pending: dict[int, int] = {}
        self._sum = 0

    def record(self, seconds: float) -> None:
        value = min(max(round(seconds * 1e6), 1), HISTOGRAM_MAX_US)
        pending = self._pending
        pending[value] = pending.get(value, 0) + 1
        if len(pending) >= self.FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        for value, count in self._pending.items():
            self._hdr.record_value(value, count)
            self._sum += value * count
        self._pending.clear()

    def summary(self) -> dict[str, float | None]:
        self._fold()
        hdr = self._hdr
        count = hdr.get_total_count()
        if count == 0:
            return dict.fromkeys([*(key for key, _ in PERCENTILES), "max", "mean"], None)
        values = hdr.get_percentile_to_value_dict([percentile for _, percentile in PERCENTILES])
        summary: dict[str, float | None] = {key: values[percentile] / 1000 for key, percentile in PERCENTILES}
        summary["max"] = hdr.get_max_value() / 1000
        summary["mean"] = round(self._sum / count / 1000, 3)
        return summary


class _Tally:
    """Counts and histograms of the requests that fell due in the measured window."""

    def __init__(self) -> None:
        self.latency = _Histogram()
        self.service = _Histogram()
        self.sent = 0
        self.sent_in_window = 0
        self.ok = 0
        self.http_errors: Counter[str] = Counter()
        self.transport_errors = dict.fromkeys(TRANSPORT_ERROR_KINDS, 0)

    def record(self, outcome: Outcome, due: float, sent_at: float | None, finished: float, window_end: float) -> None:
        self.sent += 1
        if sent_at is not None and sent_at < window_end:
            self.sent_in_window += 1
        if isinstance(outcome, str):
            self.transport_errors[outcome] += 1
            return
        if 200 <= outcome < 300:
            self.ok += 1
        else:
            self.http_errors[str(outcome)] += 1
        assert sent_at is not None
        # A timer may wake the scheduler a little early: such a request is still charged its whole service time.
        self.latency.record(finished - min(due, sent_at))
        self.service.record(finished - sent_at)


async def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


class _Run:
    """One level in progress: its clock, connections and tally.

    Every exchange ends in `complete`, called from the connection's own callbacks, which records it and at once
    hands the connection its next request: in closed loop a fresh one, in open loop the oldest one waiting.
    """

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        endpoint = _Endpoint.parse(spec.url)
        self._port = endpoint.port
        self._requests = itertools.cycle(endpoint.requests(spec))
        self._timeout_s = spec.timeout_s
        self._closed_loop = spec.concurrency is not None
        self._tally = _Tally()
        self._connections: list[_Connection] = []
        self._start = time.perf_counter()
        self._window_start = self._start + spec.warmup_s
        self._window_end = self._window_start + spec.duration_s
        self._tasks: asyncio.TaskGroup | None = None
        loop = asyncio.get_running_loop()
        self._clock = _ArrivalClock(loop)
        self._finished: asyncio.Future[None] = loop.create_future()
        self._active = 0  # connections with an exchange in progress or a connect pending
        self._idle: deque[_Connection] = deque()  # open loop: connections waiting for a request to fall due
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

    def complete(self, connection: _Connection, outcome: Outcome, finished: float) -> None:
        """Record the exchange `connection` just finished, and hand it its next request."""
        try:
            self._active -= 1
            due = connection.due
            if self._window_start <= due < self._window_end:
                self._tally.record(outcome, due, connection.sent_at, finished, self._window_end)
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

    def _connect(self) -> _Connection:
        connection = _Connection(self, self._port, self._clock)
        self._connections.append(connection)
        return connection

    def _take_up(self, connection: _Connection, due: float) -> bool:
        """Send the request due at `due` over `connection`; False where its deadline has passed, and it never went."""
        now = time.perf_counter()
        deadline = due + self._timeout_s
        if now >= deadline:  # it waited out its whole deadline for a connection
            if self._window_start <= due < self._window_end:
                self._tally.record("unsent", due, None, now, self._window_end)
            return False
        self._active += 1
        connection.send(next(self._requests), due, now, deadline)
        return True

    def _take_up_backlog(self, connection: _Connection) -> None:
        """Open loop: send the oldest request still waiting over `connection`, or let it wait for the next one."""
        while self._backlog:
            if self._take_up(connection, self._backlog.popleft()):
                return
        self._idle.append(connection)

    async def _schedule(self) -> None:
        """Open loop: take up each request when it falls due; add a connection when none is idle."""
        rng = random.Random(self.spec.seed)
        rate = self.spec.rate
        assert rate is not None
        due = self._start
        while due < self._window_end:
            await _sleep_until(due)
            if self._idle or len(self._connections) < self.spec.max_connections:
                connection = self._idle.popleft() if self._idle else self._connect()
                if not self._take_up(connection, due):  # the loop stalled past its deadline: keep the connection
                    self._idle.appendleft(connection)
            else:
                self._backlog.append(due)
                if due >= self._window_start:
                    self._pool_exhausted = True
            due += rng.expovariate(rate) if self.spec.arrivals == "poisson" else 1.0 / rate
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
        )
