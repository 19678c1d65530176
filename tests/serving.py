"""Start real twinserve servers (the CLI, as a subprocess) and real Redis on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = str(Path(__file__).resolve().parent / "models.py")
READY_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def model_path(name: str) -> str:
    return f"{TEST_MODELS}:{name}"


def predict(server: Server, model: str, instances: Any, timeout: float = 30, **kwargs: Any) -> httpx.Response:
    url = f"{server.url}/v1/models/{model}:predict"
    return httpx.post(url, json={"instances": instances}, timeout=timeout, **kwargs)


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.01)


def scrape(server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
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


class Server:
    """`twinserve serve ...` as a subprocess; `start()` returns once /v2/health/ready answers 200."""

    def __init__(self, models: Sequence[str], arch: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "twinserve",
            "serve",
            *models,
            "--arch",
            arch,
            "--port",
            str(self.port),
            *extra,
        ]
        self.env = {**os.environ, **(env or {})}
        self.log: IO[bytes] = tempfile.NamedTemporaryFile(prefix=f"twinserve-{arch}-", suffix=".log")  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        self.process = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.output()
                self.log.close()
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{output}")
            try:
                if httpx.get(self.url + "/v2/health/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling interval while waiting on the readiness condition
        self.stop()
        raise RuntimeError(f"server not ready after {READY_TIMEOUT}s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared in the server log:\n{self.output()}")
            time.sleep(0.02)

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()
        return self.process.returncode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer:
    """A throwaway redis-server on a free loopback port, no persistence."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


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
