"""Metric writes summed per interval (observability/sums.py) read exactly as the same writes made one by one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from twinserve.observability.metrics import LATENCY_BUCKETS
from twinserve.observability.sums import MetricSums, Writes

# On a bound (counted in that bucket: `le` is "less or equal"), between bounds, past the last finite one (+Inf),
# zero, and one value many times.
VALUES = [0.0005, 0.0007, 0.001, 0.003, 0.003, 0.003, 61.0, 0.0, 2.5, 0.2]


def _families(registry: CollectorRegistry) -> tuple[Histogram, Counter, Gauge]:
    return (
        Histogram("t_seconds", "t", ["model"], buckets=LATENCY_BUCKETS, registry=registry),
        Counter("t_requests", "t", ["model", "code"], registry=registry),
        Gauge("t_in_flight", "t", registry=registry),
    )


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_summed_writes_render_as_the_same_writes_made_one_by_one() -> None:
    direct, summed = CollectorRegistry(), CollectorRegistry()
    (h1, c1, g1), (h2, c2, g2) = _families(direct), _families(summed)
    sums = MetricSums(interval_s=1000.0)  # everything after the first write is held until the flush
    for value in VALUES:
        h1.labels("m").observe(value)
        writes = Writes()
        writes.observe(h2.labels("m"), value)
        sums.add(writes)
    writes = Writes()
    for wait in VALUES[:4]:
        h1.labels("batch").observe(wait)
    writes.observe_all(h2.labels("batch"), VALUES[:4])
    for code in ("200", "200", "503", "200"):
        c1.labels("m", code).inc()
        writes.inc(c2.labels("m", code))
    c1.labels("m", "200").inc(0.25)
    writes.inc(c2.labels("m", "200"), 0.25)
    for step in (1, 1, -1, 1, -1):  # a gauge's ups and downs
        g1.inc(step)
        writes.inc(g2, step)
    sums.add(writes)
    assert _exposition(direct) != _exposition(summed)  # held until the flush (the first write went at once)
    sums.flush()
    assert _exposition(direct) == _exposition(summed)
    assert 't_seconds_bucket{le="0.0005",model="m"} 2.0' in _exposition(summed)  # 0 and 0.0005 (on the bound)
    assert "t_in_flight 1.0" in _exposition(summed)


def test_a_gauge_that_went_up_and_down_in_one_interval_is_not_written() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("t_up_down", "t", registry=registry)
    sums = MetricSums(interval_s=1000.0)
    for step in (2, 1, -1):  # the first: written at once
        writes = Writes()
        writes.inc(gauge, step)
        sums.add(writes)
    sums.flush()
    assert gauge._value.get() == 2


def test_everything_is_written_when_the_last_request_in_flight_ends() -> None:
    """A client that reads the metrics (from any process) after its answer sees its request counted."""
    registry = CollectorRegistry()
    requests, gauge = Counter("t_answered", "t", registry=registry), Gauge("t_open", "t", registry=registry)
    sums = MetricSums(interval_s=1000.0)

    def answered() -> Writes:
        writes = Writes()
        writes.inc(requests)
        return writes

    sums.add(answered())  # the first: written at once; what follows is held for the interval
    sums.opened(gauge)
    assert gauge._value.get() == 1  # leaving idle: written at once, whatever the interval
    sums.opened(gauge)
    sums.ended(answered(), gauge)
    assert (requests._value.get(), gauge._value.get()) == (1, 1)  # another request is still in flight: held
    sums.ended(None, None)  # a request not counted in flight (a probe) does not end the others
    assert (requests._value.get(), gauge._value.get()) == (1, 1)
    sums.ended(answered(), gauge)
    assert (requests._value.get(), gauge._value.get()) == (3, 0)  # the last one ended: all written
