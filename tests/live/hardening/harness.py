"""What the hardening tests share: load through the lab's load generator, memory of a server's process tree."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from tests.errors import error_fields
from tests.serving import Server, free_port, wait_until
from twinserve.lab.loadgen import LevelResult, LoadSpec, run_level_sync
from twinserve.lab.probe import tree_rss_mib

HERE = Path(__file__).resolve().parent
SLEEPY = f"{HERE / 'models.py'}:Sleepy"
BODY = json.dumps({"instances": [1.5]}).encode()
#: A client that waits this long for an answer has been left hanging (loadgen counts it as a `timeout`).
CLIENT_TIMEOUT_S = 30.0


def children(pid: int) -> list[psutil.Process]:
    found: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
    return found


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


class PeakRss:
    """Samples the process tree's RSS every 100 ms on a thread until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = tree_rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, tree_rss_mib(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        # A load generator in this process can keep the sampling thread from running for a while; the memory
        # at the end counts too.
        self.peak = max(self.peak, tree_rss_mib(self.pid))


@dataclass(frozen=True)
class Outcome:
    """One request's fate: an HTTP status (with the error code of an error body), or a transport error."""

    at: float
    status: int | None
    code: str | None = None
    message: str = ""
    error: str | None = None
    retry_after: str | None = None


class Traffic:
    """`clients` threads, each sending requests one after another over a kept-alive connection, until stopped."""

    def __init__(self, url: str, body: Callable[[int], Any], clients: int = 8) -> None:
        self.url = url
        self.body = body
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, index: int) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
            n = index
            while not self._stop.is_set():
                n += len(self._threads)
                try:
                    response = http.post(self.url, json=self.body(n))
                except httpx.TransportError as exc:
                    self.outcomes.append(Outcome(time.monotonic(), None, error=type(exc).__name__))
                    time.sleep(0.01)
                    continue
                code, message = None, ""
                if response.status_code != 200:
                    error = error_fields(response.json())
                    code, message = error["code"], error["message"]
                retry_after = response.headers.get("retry-after")
                self.outcomes.append(Outcome(time.monotonic(), response.status_code, code, message, None, retry_after))

    def count(self, since: float = 0.0, status: int | None = 200) -> int:
        return sum(1 for o in list(self.outcomes) if o.at >= since and o.status == status)

    def wait_for(self, answers: int, since: float = 0.0, status: int | None = 200, timeout: float = 60) -> None:
        wait_until(lambda: self.count(since, status) >= answers, timeout, f"{answers} answers {status}")

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=CLIENT_TIMEOUT_S + 5)


class RestartableRedis:
    """A redis-server on a fixed loopback port that can be stopped and started again with its data."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.args = [
            binary,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(directory), "--dbfilename", "hardening.rdb"),
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        try:
            wait_until(lambda: self._answers(client), 30, "redis-server up", interval=0.02)
        finally:
            client.close()

    @staticmethod
    def _answers(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        """Snapshot the data (so a restart brings it back), then stop the server."""
        if self.process is None or self.process.poll() is not None:
            return
        client = redis.Redis(port=self.port)
        client.save()
        client.close()
        self.process.terminate()
        self.process.wait(timeout=10)
