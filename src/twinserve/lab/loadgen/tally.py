"""What a load level measured: outcomes counted, latency and service time in HdrHistograms (`Tally`), and the
`LevelResult` they end in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from hdrh.histogram import HdrHistogram

__all__ = ["HISTOGRAM_MAX_US", "PERCENTILES", "TRANSPORT_ERROR_KINDS", "LevelResult", "Outcome", "Tally"]

#: `unsent`: an open-loop request that waited out its whole timeout for a free connection, so never reached the server.
#: `connect_timeout`: its connection was not accepted before its deadline (a full accept backlog); `connect_error`:
#: connecting failed otherwise (this machine out of ports or files); `timeout`: sent, not answered in time.
TRANSPORT_ERROR_KINDS = ("connect_refused", "connect_timeout", "connect_error", "reset", "timeout", "unsent", "other")
#: Summary key -> percentile, for both latency and service time.
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
HISTOGRAM_MAX_US = 60_000_000

Outcome = int | str  # an HTTP status code, or one of TRANSPORT_ERROR_KINDS


@dataclass
class LevelResult:
    """What one load level measured; latencies in milliseconds, `None` where no response came back.

    `sent` counts requests that fell due in the window; `sent == ok + sum(http_errors) + sum(transport_errors)`.
    `latency_ms` counts from when a request fell due, `service_time_ms` from when a connection took it up; both
    cover every HTTP response, error statuses included. `throughput_rps` is responses per measured second.
    `achieved_rate` (open loop) is requests actually sent within the window per second. `pool_exhausted` says
    requests had to queue for a connection, so the server, not the generator, set the pace. `retries` counts the
    extra sends of refused requests (`LoadSpec.retries`), each request counted once in `sent` whatever its tries.
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
    retries: int = 0
    #: 2xx answers that arrived within the window, whenever their requests fell due: the server's goodput there.
    #: Past a saturated pool (open loop), the requests that fell due in the window (`ok`) are answered long after
    #: it, behind the warm-up's backlog, so `ok` per second is not a rate of answers.
    ok_in_window: int = 0
    #: `http_errors` by status and the server's error code from the answer's JSON body (`"503 queue_full"`; the
    #: status alone where the body names none).
    http_error_codes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def errors_by_kind(self) -> dict[str, int]:
        """Every failed request by kind: HTTP answers by status and code (`"503 queue_full"`), transport failures
        by kind (`"timeout"`, `"connect_refused"`); kinds that did not occur left out."""
        kinds = dict(self.http_error_codes or self.http_errors)
        kinds.update((kind, n) for kind, n in self.transport_errors.items() if n)
        return kinds


class _Histogram:
    """An HdrHistogram of microseconds, fed through a dict of exact counts.

    hdrh buckets each value in pure Python, far slower than a dict update, which would slow the generator. The dict is
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


class Tally:
    """Counts and histograms of the requests that fell due in the measured window."""

    def __init__(self) -> None:
        self.latency = _Histogram()
        self.service = _Histogram()
        self.sent = 0
        self.sent_in_window = 0
        self.ok = 0
        self.ok_in_window = 0
        self.http_errors: Counter[str] = Counter()
        #: (status, the server's error code or None) -> count: keyed by what came off the wire, named once at the end.
        self.http_error_codes: Counter[tuple[int, bytes | None]] = Counter()
        self.transport_errors = dict.fromkeys(TRANSPORT_ERROR_KINDS, 0)
        self.retries = 0

    def error_codes(self) -> dict[str, int]:
        """The HTTP errors by status and code, named: `{"503 queue_full": 12, "500": 1}`."""
        named: Counter[str] = Counter()
        for (status, code), n in self.http_error_codes.items():
            named[f"{status} {code.decode('ascii')}" if code else str(status)] += n
        return dict(sorted(named.items()))

    def record(
        self,
        outcome: Outcome,
        due: float,
        sent_at: float | None,
        finished: float,
        window_end: float,
        code: bytes | None = None,
    ) -> None:
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
            self.http_error_codes[outcome, code] += 1
        assert sent_at is not None
        # A timer may wake the scheduler a little early: such a request is still charged its whole service time.
        self.latency.record(finished - min(due, sent_at))
        self.service.record(finished - sent_at)
