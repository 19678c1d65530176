"""Shared by the benchmark scripts: drive a server with wrk and read its figures."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from twinserve.lab.servers import ServerProcess, TwinserveServer

__all__ = ["ROOT", "Server", "example_request", "require_wrk", "warm_wrk", "wrk"]

ROOT = Path(__file__).resolve().parent.parent
#: twinserve as a user starts it, on the port it binds and announces: the lab's server-process helper.
Server = TwinserveServer

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def require_wrk() -> None:
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install -y wrk)")


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _grab(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.M)
    if match is None:
        raise RuntimeError(f"wrk output has no {pattern!r}:\n{text}")
    return match.group(1)


def wrk(
    url: str, body: bytes, connections: int, seconds: float, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """POST `body` to `url` over `connections` keep-alive connections; req/s, P50/P99 (ms) and errors."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body.decode())}\n"
        )
        for name, value in (headers or {}).items():
            script.write(f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}\n")
    try:
        threads, duration = str(min(connections, 2)), f"{max(1, round(seconds))}s"
        command = ["wrk", "-t", threads, "-c", str(connections), "-d", duration, "--latency", "-s", script.name, url]
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    finally:
        Path(script.name).unlink()
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, socket.groups())) if socket else 0)
    return {
        "rps": float(_grab(r"Requests/sec:\s+([\d.]+)", out)),
        "p50": _ms(_grab(r"^\s+50%\s+(\S+)", out)),
        "p99": _ms(_grab(r"^\s+99%\s+(\S+)", out)),
        "errors": errors,
    }


def example_request(server: ServerProcess, headers: dict[str, str] | None = None) -> tuple[str, bytes]:
    """The predict URL of the server's first model and a one-instance body from its own examples."""
    name = httpx.get(server.url + "/v1/models", headers=headers).json()["models"][0]  # names (KServe V1)
    meta: dict[str, Any] = httpx.get(f"{server.url}/v1/models/{name}", headers=headers).json()
    body = json.dumps({"instances": meta["examples"][:1]}).encode()
    return f"{server.url}/v1/models/{name}:predict", body


def warm_wrk(server: ServerProcess, seconds: float, connections: int) -> dict[str, float]:
    """Start `server`, warm it for 3 s, then `wrk` its first model's example for `seconds`; stopped after."""
    with server:
        url, body = example_request(server)
        wrk(url, body, connections, 3)  # warm-up: batches, allocator pools, the libraries' thread pools
        return wrk(url, body, connections, seconds)
