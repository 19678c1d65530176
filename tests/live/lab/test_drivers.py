"""The load drivers against a real server: what a driver says it sent is what the server counted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serving import Server, model_path, sample, scrape
from twinserve.lab.drivers import _locust


def answered(server: Server) -> float:
    """The server's own count of requests answered on `predict`, every status."""
    samples = scrape(server)
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "twinserve_requests_total" and dict(labels).get("endpoint") == "predict"
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server([model_path("Echo")], "async") as started:
        yield started


def test_locust_reports_the_window_the_server_counted(server: Server) -> None:
    """Before: 430 sent vs 602 counted and 2.0 s measured of 3 s asked (stats reset once spawning ended, a second in;
    users cut off mid-request at the end)."""
    url = f"{server.url}/v1/models/echo:predict"
    before = answered(server)
    level = _locust(url, [b'{"instances": [1]}', b'{"instances": [2, 3]}'], 2, 2.0, 0.0)
    counted = answered(server) - before
    assert level["sent"] == counted > 0
    assert level["ok"] == level["sent"] and sample(scrape(server), "twinserve_worker_deaths_total") == 0
    assert level["duration_s"] > 1.75  # the 2 s asked (up to the last answer), not what followed a spawn ramp
    assert level["throughput_rps"] == pytest.approx(level["sent"] / level["duration_s"], rel=0.01)


def test_locust_leaves_its_warmup_out_of_the_count(server: Server) -> None:
    url = f"{server.url}/v1/models/echo:predict"
    before = answered(server)
    level = _locust(url, [b'{"instances": [1]}'], 2, 1.0, 1.0)
    counted = answered(server) - before
    assert 0 < level["sent"] < counted  # the warm-up's requests reached the server, not the level
