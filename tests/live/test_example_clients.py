"""The example clients in `examples/clients/` work against every architecture, as a user would run them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ARCHS
from tests.serving import ROOT, Server

CLIENTS = ROOT / "examples" / "clients"


def run_client(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CLIENTS / name), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_http_client_predicts_through_v1_and_v2(server: Server) -> None:
    run = run_client("http_client.py", "--url", server.url, "--model", "iris")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("model iris version")
    v1 = [line for line in lines if line.startswith("V1 ")]
    assert v1 and all('"label"' in line for line in v1)
    assert "V2 inputs: input FP32[-1, 4]" in lines
    assert any(line.startswith("V2 label BYTES") and "setosa" in line for line in lines)
    refused = run_client("http_client.py", "--url", server.url, "--model", "nope")
    assert refused.returncode == 1 and "HTTP 404" in refused.stderr and "model_not_found" in refused.stderr


@pytest.mark.parametrize("tensors", [[], ["--json"]], ids=["binary", "json"])
def test_triton_client_classifies(server: Server, tensors: list[str]) -> None:
    run = run_client("triton_client.py", "--url", server.url.removeprefix("http://"), *tensors)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("server twinserve")
    assert "live True, ready True, model ready True" in lines
    assert "label: ['setosa', 'versicolor', 'virginica']" in lines
    assert "class_id: [0, 1, 2]" in lines
    refused = run_client("triton_client.py", "--url", server.url.removeprefix("http://"), "--model", "nope")
    assert refused.returncode == 1 and "nope" in refused.stderr


@pytest.mark.parametrize("arch", ARCHS)
def test_websocket_client_streams(servers: dict[str, Server], arch: str) -> None:
    url = servers[arch].url.replace("http://", "ws://") + "/v1/models/iris/ws"
    run = run_client("websocket_client.py", "--url", url, "--messages", "50", "--window", "8")
    if arch == "sync":
        assert run.returncode != 0 and "501" in run.stderr  # WebSocket needs the async or hybrid architecture
        return
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("50 messages answered")
    assert "m0 -> [{'label': 'setosa'" in run.stdout
