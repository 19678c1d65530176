"""Refusals by admission control are logged in aggregate: one line per interval, not one per refusal."""

from __future__ import annotations

import logging

import pytest

from twinserve.observability.refusals import UNPARSED, RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_refusals_is_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RefusalLog(interval_s=1000.0, clock=clock)  # the interval's timer never fires within the test
    with caplog.at_level(logging.WARNING, logger="twinserve.admission"):
        log.refused("iris", "queue_full")  # the first after a quiet spell: at once
        assert len(caplog.records) == 1 and "refused 1 request(s)" in caplog.records[0].getMessage()
        for _ in range(500):
            log.refused("iris", "queue_full")
        for _ in range(7):
            log.refused("echo", "rate_limited")
        assert len(caplog.records) == 1  # held for the interval's line
        clock.now += 4.0
        log.flush()  # what the interval's end writes
        assert len(caplog.records) == 2
        line = caplog.records[1].getMessage()
        assert "refused 507 request(s) in 4.0 s" in line
        assert "iris queue_full 500, echo rate_limited 7" in line
        log.flush()
        assert len(caplog.records) == 2  # nothing counted since: nothing written


def test_after_a_quiet_interval_a_refusal_is_logged_at_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RefusalLog(interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="twinserve.admission"):
        log.refused("iris", "deadline_unmeetable")
        clock.now += 11.0
        log.refused("iris", "deadline_unmeetable")
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "refused 1 request(s) in 0.0 s",
        "refused 1 request(s) in 0.0 s",
    ]


def test_requests_the_server_could_not_parse_have_a_line_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RefusalLog(interval_s=1000.0, clock=clock, message=UNPARSED)
    with caplog.at_level(logging.WARNING, logger="twinserve.admission"):
        log.refused("", "malformed_http")
        for _ in range(40):
            log.refused("", "malformed_http")
        log.refused("", "uri_too_long")
        clock.now += 2.0
        log.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "answered 1 request(s) the HTTP server could not read in 0.0 s (model reason count: - malformed_http 1), "
        "each before any route, closing its connection",
        "answered 41 request(s) the HTTP server could not read in 2.0 s (model reason count: - malformed_http 40, "
        "- uri_too_long 1), each before any route, closing its connection",
    ]
