"""A real Prometheus server scrapes `/metrics` of each architecture and answers a query about it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ARCHS
from tests.serving import Server, free_port, model_path, predict


@pytest.mark.parametrize("arch", ARCHS)
def test_prometheus_scrapes_request_counts(arch: str, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed (apt-get install -y prometheus)"
    with Server([model_path("Echo")], arch, "--workers", "2") as server:
        for i in range(7):
            assert predict(server, "echo", [i]).status_code == 200
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n"
            f"  - job_name: twinserve\n    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n"
        )
        port = free_port()
        prometheus = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            query = 'sum(twinserve_requests_total{model="echo",endpoint="predict",code="200"})'
            deadline = time.monotonic() + 60
            value = None
            while time.monotonic() < deadline:
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}).json()
                    result = answer["data"]["result"]
                    if result:
                        value = float(result[0]["value"][1])
                        break
                except (httpx.TransportError, KeyError, ValueError):
                    pass
                time.sleep(0.2)  # polling interval while Prometheus starts and scrapes
            assert value == 7
            up = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}).json()
            assert up["data"]["result"][0]["value"][1] == "1"
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
