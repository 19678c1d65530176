"""What the hardening tests share: load through the lab's load generator, memory of a server's process tree."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tests.serving import Server
from twinserve.lab.loadgen import LevelResult, LoadSpec, run_level_sync

HERE = Path(__file__).resolve().parent
SLEEPY = f"{HERE / 'models.py'}:Sleepy"
BODY = json.dumps({"instances": [1.5]}).encode()
#: A client that waits this long for an answer has been left hanging (loadgen counts it as a `timeout`).
CLIENT_TIMEOUT_S = 30.0


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a server process and all its descendants (workers, model workers), in MiB."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:  # a worker that exited between listing and reading
            continue
    return total / 2**20


def children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def closed_loop(server: Server, model: str, concurrency: int, duration_s: float, warmup_s: float = 0.5) -> LevelResult:
    return run_level_sync(
        LoadSpec(
            url=f"{server.url}/v1/models/{model}:predict",
            bodies=[BODY],
            duration_s=duration_s,
            warmup_s=warmup_s,
            concurrency=concurrency,
            timeout_s=CLIENT_TIMEOUT_S,
        )
    )


def open_loop(server: Server, model: str, rate: float, duration_s: float, max_connections: int) -> LevelResult:
    return run_level_sync(
        LoadSpec(
            url=f"{server.url}/v1/models/{model}:predict",
            bodies=[BODY],
            duration_s=duration_s,
            rate=rate,
            max_connections=max_connections,
            timeout_s=CLIENT_TIMEOUT_S,
        )
    )


@dataclass
class Prober:
    """Requests sent one after another on a thread of their own, kept whole (status, headers, body) for checks
    the load generator, which only counts statuses, cannot make."""

    url: str
    statuses: Counter[int] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
            while not self._stop.is_set():
                try:
                    response = client.post(self.url, content=BODY, headers={"Content-Type": "application/json"})
                except httpx.TransportError as exc:
                    self.errors[type(exc).__name__] += 1
                    continue
                self.statuses[response.status_code] += 1
                if response.status_code in (429, 503) and "retry-after" not in response.headers:
                    self.bad.append(f"{response.status_code} without Retry-After: {response.text}")
                elif response.status_code == 200 and response.json() != {"predictions": [3.0]}:
                    self.bad.append(f"wrong answer: {response.text}")
                elif response.status_code not in (200, 429, 503):
                    self.bad.append(f"{response.status_code}: {response.text}")

    def stop(self) -> None:
        self._stop.set()


@contextmanager
def probing(server: Server, model: str, clients: int = 4) -> Iterator[list[Prober]]:
    probers = [Prober(f"{server.url}/v1/models/{model}:predict") for _ in range(clients)]
    threads = [threading.Thread(target=p.run, daemon=True) for p in probers]
    for thread in threads:
        thread.start()
    try:
        yield probers
    finally:
        for prober in probers:
            prober.stop()
        for thread in threads:
            thread.join(timeout=CLIENT_TIMEOUT_S + 5)


def wait_until(condition: object, timeout: float, what: str, interval: float = 0.1) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(interval)
