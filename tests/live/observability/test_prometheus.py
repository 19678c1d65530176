"""A real Prometheus server scrapes `/metrics` of each architecture and answers a query about it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ARCHS
from tests.serving import Server, model_path, predict
from twinserve.lab.servers import PrometheusServer


@pytest.mark.parametrize("arch", ARCHS)
def test_prometheus_scrapes_request_counts(arch: str, tmp_path: Path) -> None:
    with Server([model_path("Echo")], arch, "--workers", "2") as server:
        for i in range(7):
            assert predict(server, "echo", [i]).status_code == 200
        with PrometheusServer([f"127.0.0.1:{server.port}"], tmp_path) as prometheus:
            query = 'sum(twinserve_requests_total{model="echo",endpoint="predict",code="200"})'
            deadline = time.monotonic() + 60
            value = None
            while time.monotonic() < deadline:
                try:
                    result = prometheus.query(query)["result"]
                    if result:
                        value = float(result[0]["value"][1])
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)  # polling interval while Prometheus scrapes
            assert value == 7
            up = prometheus.query("up")
            assert up["result"][0]["value"][1] == "1"
