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

from twinserve.lab.servers import (
    READY_TIMEOUT_S,
    RedisServer,
    ServerFailed,
    ServerProcess,
    TwinserveServer,
    free_port,
    loopback,
)

__all__ = [
    "HTTP",
    "READY_TIMEOUT",
    "ROOT",
    "TEST_MODELS",
    "RedisServer",
    "Server",
    "ServerFailed",
    "ServerProcess",
    "SharedServers",
    "free_port",
    "model_path",
    "predict",
    "sample",
    "scrape",
    "servers_per_arch",
    "wait_for_file",
    "wait_for_new_output",
    "wait_until",
]

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = str(Path(__file__).resolve().parent / "models.py")
READY_TIMEOUT = READY_TIMEOUT_S
#: The client of the tests' one-off requests (`HTTP.get(...)` where `httpx.get(...)` would do), the lab's own
#: (`loopback`): `httpx.get` builds a client, and with it a TLS context that loads the CA bundle (~21 ms of CPU), for
#: every request, though every URL here is plain HTTP on loopback; that was a third of some live modules' time. No
#: connection is kept between requests, as with `httpx.get`: a test that counts or closes connections sees the same.
HTTP = loopback()


def model_path(name: str) -> str:
    return f"{TEST_MODELS}:{name}"


def predict(server: ServerProcess, model: str, instances: Any, timeout: float = 30, **kwargs: Any) -> httpx.Response:
    url = f"{server.url}/v1/models/{model}:predict"
    return HTTP.post(url, json={"instances": instances}, timeout=timeout, **kwargs)


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    wait_until(path.exists, timeout, f"{path} to appear", interval=0.01)


def wait_for_new_output(server: ServerProcess, since: int, text: str, timeout: float = 30.0) -> None:
    """Return once `text` appears in what `server` printed past the first `since` characters of its output (a mark
    taken as `len(server.output())`), so that on a server tests share, what an earlier test made it print does not
    count; AssertionError with that part of the output if it does not."""
    if not poll(lambda: text in server.output()[since:], timeout):
        raise AssertionError(
            f"{text!r} never appeared in the server log after {since} characters:\n{server.output()[since:]}"
        )


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

    text = HTTP.get(server.url + "/metrics", timeout=30).text
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
        self.arch = arch  # for a test handed a shared server by a fixture parametrised over architectures


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


class SharedServers:
    """Servers that a module's tests share, one per distinct command (models, architecture, flags), each started
    when a test first asks for it and all stopped by `stop` (a module-scoped fixture's teardown): for tests on one
    flag set that no fixture parametrised over architectures groups (a test of one architecture, a flag set taken
    from the test's own parameters). A test on a shared server leaves it as it found it, and measures what it
    checks from what it found (a delta, its own request ids, the output past a mark)."""

    def __init__(self) -> None:
        self._started: dict[tuple[tuple[str, ...], str, tuple[str, ...]], Server] = {}

    def get(self, models: Sequence[str], arch: str, *flags: str) -> Server:
        key = (tuple(models), arch, tuple(flags))
        server = self._started.get(key)
        if server is None:
            server = self._started[key] = Server(models, arch, *flags).start()
        return server

    def stop(self) -> None:
        started, self._started = list(self._started.values()), {}
        for server in started:
            server.stop()
