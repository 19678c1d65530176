"""The lab's load generator: closed- or open-loop HTTP/1.1 load on a loopback server, measured honestly.

Closed loop: `concurrency` keep-alive connections, each sending its next request as soon as the last is answered.

Open loop: requests fall due at `rate` per second (Poisson or evenly spaced arrivals) whether or not the server keeps
up, and go out over a pool of connections that grows on demand up to `max_connections`. When the pool is exhausted a
request waits for a free connection, yet its `latency` still counts from the moment it fell due (the
coordinated-omission correction); its `service_time` counts from when a connection took it up.

Only requests that fall due inside the measured window count; those still in flight when it ends may finish, each
within `timeout_s` of falling due, after which it counts as a `timeout`. Event-loop timers tick in milliseconds,
so open-loop latency may carry up to about a millisecond of the scheduler's own slack; service time does not.

The client is a minimal HTTP/1.1 one on asyncio streams with every request encoded up front, so that the generator,
one thread, is rarely the limit; when it may have been, the result says so (`generator_limited`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from hdrh.histogram import HdrHistogram

__all__ = ["LevelResult", "LoadSpec", "run_level", "run_level_sync"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})
TRANSPORT_ERROR_KINDS = ("connect_refused", "reset", "timeout", "other")
#: Summary key -> percentile, for both latency and service time.
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
HISTOGRAM_MAX_US = 60_000_000
#: The generator is one event-loop thread: at this share of one core it is probably the bottleneck.
CPU_LIMIT_PERCENT = 90.0
#: Open loop: sending this share fewer requests than were due, with connections to spare, means the generator lagged.
RATE_SHORTFALL = 0.05
#: Framing headers the client writes itself.
_RESERVED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})
_CONNECTION = b"\r\nconnection:"
_CONTENT_LENGTH = b"\r\ncontent-length:"
_TRANSFER_ENCODING = b"\r\ntransfer-encoding:"

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


class _MalformedResponse(ValueError):
    pass


class _Connection:
    """One keep-alive connection; any failure closes it, and the next exchange opens a fresh one."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def exchange(self, request: bytes) -> int:
        """Send `request` and read the whole response; its status code."""
        reader, writer = self._reader, self._writer
        try:
            if reader is None or writer is None or reader.at_eof():  # at_eof: the server closed it while idle
                self.close()
                # The literal address, even for "localhost": no resolver call per connection, no IPv6 detour.
                reader, writer = await asyncio.open_connection("127.0.0.1", self._port)
                self._reader, self._writer = reader, writer
            writer.write(request)
            status, keep_alive = await _read_response(reader)
        except BaseException:
            self.close()
            raise
        if not keep_alive:
            self.close()
        return status

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def aclose(self) -> None:
        writer = self._writer
        self.close()
        if writer is not None:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Status code and whether the connection stays open, with the body read (and dropped)."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.") or head[12:13] not in (b" ", b"\r"):
            raise _MalformedResponse(f"not an HTTP/1.x status line: {head[:40]!r}")
        status = int(head[9:12])
        if not 100 <= status < 200:  # skip interim responses
            break
    fields = head.lower()
    connection = _field(fields, _CONNECTION)
    keep_alive = b"close" not in connection if head.startswith(b"HTTP/1.1") else b"keep-alive" in connection
    if status in (204, 304):
        return status, keep_alive
    if b"chunked" in _field(fields, _TRANSFER_ENCODING):
        await _read_chunked(reader)
    elif length := _field(fields, _CONTENT_LENGTH):
        await reader.readexactly(int(length))
    else:
        await reader.read()  # no framing: the body runs to the end of the connection
        keep_alive = False
    return status, keep_alive


def _field(fields: bytes, key: bytes) -> bytes:
    start = fields.find(key)
    if start < 0:
        return b""
    start += len(key)
    return fields[start : fields.index(b"\r\n", start)].strip()


async def _read_chunked(reader: asyncio.StreamReader) -> None:
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields
                pass
            return
        await reader.readexactly(size + 2)


def _histogram() -> Any:
    return HdrHistogram(1, HISTOGRAM_MAX_US, 3)


def _summary(histogram: Any) -> dict[str, float | None]:
    if histogram.get_total_count() == 0:
        return dict.fromkeys([*(key for key, _ in PERCENTILES), "max", "mean"], None)
    summary: dict[str, float | None] = {
        key: histogram.get_value_at_percentile(percentile) / 1000 for key, percentile in PERCENTILES
    }
    summary["max"] = histogram.get_max_value() / 1000
    summary["mean"] = round(histogram.get_mean_value() / 1000, 3)
    return summary


class _Tally:
    """Counts and histograms of the requests that fell due in the measured window."""

    def __init__(self) -> None:
        self.latency = _histogram()
        self.service = _histogram()
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
        _record(self.latency, finished - min(due, sent_at))
        _record(self.service, finished - sent_at)


def _record(histogram: Any, seconds: float) -> None:
    histogram.record_value(min(max(round(seconds * 1e6), 1), HISTOGRAM_MAX_US))


async def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


class _Run:
    """One level in progress: its clock, connections and tally."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        endpoint = _Endpoint.parse(spec.url)
        self._port = endpoint.port
        self._requests = endpoint.requests(spec)
        self._next = 0
        self._tally = _Tally()
        self._connections: list[_Connection] = []
        self._start = time.perf_counter()
        self._window_start = self._start + spec.warmup_s
        self._window_end = self._window_start + spec.duration_s
        self._due: asyncio.Queue[float | None] = asyncio.Queue()
        self._idle = 0
        self._pool_exhausted = False

    async def run(self) -> LevelResult:
        try:
            async with asyncio.TaskGroup() as tasks:
                cpu = tasks.create_task(self._cpu_percent())
                if self.spec.concurrency is not None:
                    for _ in range(self.spec.concurrency):
                        tasks.create_task(self._closed_loop(self._connect()))
                else:
                    tasks.create_task(self._schedule(tasks))
        finally:
            await asyncio.gather(*(connection.aclose() for connection in self._connections))
        return self._result(cpu.result())

    def _connect(self) -> _Connection:
        connection = _Connection(self._port)
        self._connections.append(connection)
        return connection

    async def _closed_loop(self, connection: _Connection) -> None:
        while (now := time.perf_counter()) < self._window_end:
            await self._issue(connection, now)

    async def _schedule(self, tasks: asyncio.TaskGroup) -> None:
        """Open loop: put each request on the queue when it falls due; add a connection when none is idle."""
        rng = random.Random(self.spec.seed)
        rate = self.spec.rate
        assert rate is not None
        due = self._start
        while due < self._window_end:
            await _sleep_until(due)
            self._due.put_nowait(due)
            if self._due.qsize() > self._idle:
                if len(self._connections) < self.spec.max_connections:
                    tasks.create_task(self._open_loop(self._connect()))
                elif due >= self._window_start:
                    self._pool_exhausted = True
            due += rng.expovariate(rate) if self.spec.arrivals == "poisson" else 1.0 / rate
        for _ in self._connections:
            self._due.put_nowait(None)

    async def _open_loop(self, connection: _Connection) -> None:
        while True:
            self._idle += 1
            try:
                due = await self._due.get()
            finally:
                self._idle -= 1
            if due is None:
                return
            await self._issue(connection, due)

    async def _issue(self, connection: _Connection, due: float) -> None:
        request = self._requests[self._next % len(self._requests)]
        self._next += 1
        now = time.perf_counter()
        deadline = due + self.spec.timeout_s
        sent_at: float | None = None
        outcome: Outcome
        if now >= deadline:  # it waited out its whole deadline for a connection: never sent
            outcome = "timeout"
        else:
            sent_at = now
            try:
                async with asyncio.timeout(deadline - now):
                    outcome = await connection.exchange(request)
            except TimeoutError:
                outcome = "timeout"
            except ConnectionRefusedError:
                outcome = "connect_refused"
            except (ConnectionError, asyncio.IncompleteReadError):
                outcome = "reset"
            except (OSError, ValueError, asyncio.LimitOverrunError):
                outcome = "other"
        if self._window_start <= due < self._window_end:
            self._tally.record(outcome, due, sent_at, time.perf_counter(), self._window_end)

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
            latency_ms=_summary(tally.latency),
            service_time_ms=_summary(tally.service),
            generator_cpu_percent=round(cpu_percent, 1),
            generator_limited=cpu_percent >= CPU_LIMIT_PERCENT or lagged,
            connections_used=len(self._connections),
            pool_exhausted=self._pool_exhausted,
        )
