"""The lab's figures in words, as a user read them on 2026-12-05: "1 connections", and "0% of the model's
in-process ceiling" for a server that reached 0.3% of a very fast model's."""

from __future__ import annotations

from tests.factory import level, results, run
from twinserve.lab.advise import advise
from twinserve.lab.report.rows import format_errors
from twinserve.lab.results import Ceiling


def test_one_connection_is_singular() -> None:
    assert level(1, 500, 5).load_text == "1 connection"
    assert level(32, 500, 5).load_text == "32 connections"


def test_a_share_of_the_ceiling_under_one_percent_keeps_two_digits() -> None:
    asyn = run("async", "async", [level(1, 300, 10)])
    ceiling = [Ceiling(batch_size=32, batch_ms_median=0.4, instances_per_s=80_000, cores=1.0)]
    line = advise(results(asyn).model_copy(update={"ceiling": ceiling}), 50).lines[0]
    # 300 req/s of one instance against 2 cores x 80,000 instances/s: 0.19%, not "0%".
    assert "up to 300 req/s at 1 connection (" in line
    assert "That is 0.19% of the model's in-process ceiling on 2 core(s)" in line


def test_errors_are_named_by_status_and_the_servers_code() -> None:
    refused = level(32, 950, 80, errors=12).model_copy(update={"http_error_codes": {"503 queue_full": 12}})
    assert format_errors(refused) == "12 (0.3%) · 503 queue_full: 12"
    assert format_errors(level(32, 950, 80, errors=12)) == "12 (0.3%) · 503: 12"  # a driver that reads no body
