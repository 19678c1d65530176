"""Real twinserve servers (the CLI, as a subprocess) and real Redis on loopback, started with the lab's one
server-process helper (`twinserve.lab.servers`); plus the small request and metrics helpers the tests share."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from twinserve.lab.servers import READY_TIMEOUT_S, RedisServer, ServerFailed, ServerProcess, TwinserveServer, free_port

__all__ = [
    "READY_TIMEOUT",
    "ROOT",
    "TEST_MODELS",
    "RedisServer",
    "Server",
    "ServerFailed",
    "ServerProcess",
    "free_port",
    "model_path",
    "predict",
    "sample",
    "scrape",
    "servers_per_arch",
    "wait_for_file",
    "wait_until",
]

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = str(Path(__file__).resolve().parent / "models.py")
READY_TIMEOUT = READY_TIMEOUT_S


def model_path(name: str) -> str:
    return f"{TEST_MODELS}:{name}"


def predict(server: ServerProcess, model: str, instances: Any, timeout: float = 30, **kwargs: Any) -> httpx.Response:
    url = f"{server.url}/v1/models/{model}:predict"
    return httpx.post(url, json={"instances": instances}, timeout=timeout, **kwargs)


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    wait_until(path.exists, timeout, f"{path} to appear", interval=0.01)


def read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response with a Content-Length body, read from `sock`: its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def wait_until(
    condition: Callable[[], object], timeout: float = 30.0, what: str = "the condition", interval: float = 0.02
) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds (no fixed sleep in a test)."""
    assert poll(condition, timeout, interval), f"{what} not within {timeout} s"


def poll(condition: Callable[[], object], timeout: float, interval: float = 0.02) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False): for a test that goes on either way."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def scrape(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """`GET /metrics`, parsed by prometheus-client: {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


class Server(TwinserveServer):
    """`twinserve serve MODEL... --arch ARCH EXTRA...` run from the repository root; `start()` returns once
    /v2/health/ready answers 200, on the port the server bound itself and announced."""

    def __init__(self, models: Sequence[str], arch: str, *extra: str, env: dict[str, str] | None = None) -> None:
        super().__init__(models, arch, *extra, env=env, cwd=ROOT)


@contextmanager
def servers_per_arch(archs: Sequence[str], make: Callable[[str], Server]) -> Iterator[dict[str, Server]]:
    """`make(arch).start()` for each architecture; every server started is stopped on the way out."""
    started: dict[str, Server] = {}
    try:
        for arch in archs:
            started[arch] = make(arch).start()
        yield started
    finally:
        for server in started.values():
            server.stop()
