"""Servers started the way a user starts them (a command, as a subprocess) and watched from outside.

The one server-process helper of the project (the lab, the tests and `benchmarks/` use it). A server is ready once
a condition holds, never after a fixed sleep; one that exits or never becomes ready fails loudly with what it
printed; stopping it (SIGTERM, then SIGKILL) takes its whole session. twinserve binds `--port 0` itself and
announces its port, so no other process can take it in between; other servers get one from `free_port`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import httpx
import orjson

__all__ = [
    "READY_TIMEOUT_S",
    "STOP_GRACE_S",
    "PrometheusServer",
    "RedisServer",
    "ServerFailed",
    "ServerProcess",
    "TwinserveServer",
    "announced_grpc",
    "announced_url",
    "free_port",
    "http_ready",
    "loopback",
    "request_bodies",
]

#: Generous: a model may take a while to load on a busy machine; a server that is ready returns much sooner.
READY_TIMEOUT_S = 120.0
#: How long a SIGTERM'd server may take to finish what it has in flight before it is killed.
STOP_GRACE_S = 30.0
#: How often the readiness condition is polled.
_POLL_S = 0.05
#: How much of the server's output a failure quotes (its end, where the reason is).
_QUOTED_CHARS = 20_000
#: twinserve's start-up line on a terminal: `twinserve: serving NAME (ARCH) on URL; ready once ...`.
_CONSOLE_ANNOUNCE = re.compile(r"^twinserve: serving .* on (https?://\S+); ready once", re.M)
_CONSOLE_GRPC = re.compile(r"^twinserve: gRPC \(inference\.GRPCInferenceService\) on (\S+)$", re.M)


class ServerFailed(RuntimeError):
    """The server exited, or never became ready; the message ends with what it printed."""


#: Where `free_port` looks first: below the kernel's ephemeral range, which it reads from here (Linux).
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000


def free_port() -> int:
    """A loopback port free right now, for servers that cannot bind port 0 and say which port they got.

    Another process may take it before the server binds it: prefer `--port 0` and `announced_url` where possible.
    The port is drawn from below the kernel's ephemeral range where it is known: every `bind(port 0)` and outgoing
    connection takes its port from that range, so a server that starts helpers of its own before binding the port
    it was given (Ray's daemons and workers) cannot be handed the same port by the kernel meanwhile (it was, once:
    Ray's proxy failed with "Address already in use").
    """
    with contextlib.suppress(OSError, ValueError):
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
        rng = random.Random()
        for _ in range(50):
            port = rng.randrange(_LOWEST_PORT, low) if low > _LOWEST_PORT else 0
            if port and _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        bound: int = sock.getsockname()[1]
        return bound


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def announced_grpc(output: str) -> str | None:
    """The `host:port` of the gRPC service (`--grpc-port`) from the start-up line, or None if it has not said it."""
    for line in output.splitlines():
        if line.startswith("{") and '"serving"' in line:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "serving" and isinstance(event.get("grpc"), str):
                    return str(event["grpc"])
    match = _CONSOLE_GRPC.search(output)
    return match.group(1) if match else None


def announced_url(output: str) -> str | None:
    """The address twinserve says it listens on, from its start-up line, or None if it has not said it yet.

    The line is the JSON `serving` event (logs to a file or a pipe) or the plain console line (a terminal, or
    `--log-format console`).
    """
    for line in output.splitlines():
        if line.startswith("{") and '"serving"' in line:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "serving" and isinstance(event.get("url"), str):
                    return str(event["url"])
    match = _CONSOLE_ANNOUNCE.search(output)
    return match.group(1) if match else None


@functools.cache
def loopback() -> httpx.Client:
    """The client of the lab's small requests to the servers it runs (readiness polls, scrapes): `httpx.get` builds
    a TLS context per call, loading the CA bundle, and frequent polls made that a CPU load of its own beside the
    server starting. No connection is kept between requests, as with `httpx.get`."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def http_ready(path: str) -> Callable[[ServerProcess], bool]:
    """The readiness condition "GET `path` answers 200"."""

    def ready(server: ServerProcess) -> bool:
        with contextlib.suppress(httpx.TransportError):
            return loopback().get(server.url + path, timeout=2.0).status_code == 200
        return False

    return ready


class ServerProcess:
    """A server command as a subprocess in its own session, its output (stdout and stderr) in one log.

    `port`: where the server listens when the caller chose it; None when the server binds a port of its own
    choosing and announces it (twinserve's `--port 0`). `ready`: the condition `start` waits for (by default its
    `/v2/health/ready` answers 200). `log_path`: where its output goes (a temporary file when None).
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        port: int | None = None,
        ready: Callable[[ServerProcess], bool] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_path: Path | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
        grace: float = STOP_GRACE_S,
    ) -> None:
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.grace = grace
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._ready = ready if ready is not None else http_ready("/v2/health/ready")
        self._url = None if port is None else f"http://127.0.0.1:{port}"
        self._log: IO[bytes] | None = None
        self._kept: str | None = None  # the output of a temporary log, read before the file went away

    # -- where it is --------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """`http://host:port`: the port given, or the one the server announced (known once `start` returned)."""
        return self._http_url()

    @property
    def port(self) -> int:
        url = self._http_url()
        port = httpx.URL(url).port
        assert port is not None, url
        return port

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the server has not been started")
        return self.process.pid

    # -- its life -----------------------------------------------------------------------------------------------
    def start(self) -> Self:
        """Start the server and return once it is ready; raise `ServerFailed` (after stopping it) if it exits
        first or is not ready within `ready_timeout` seconds."""
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("wb")
        else:
            self._log = tempfile.NamedTemporaryFile(prefix="twinserve-server-", suffix=".log")  # noqa: SIM115
        self._kept = None
        started = time.monotonic()
        # Its own session: a Ctrl-C meant for the caller does not reach it, and a kill can take its whole group.
        self.process = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True
        )
        try:
            self._wait_until_ready(self.process, started + self.ready_timeout)
        except BaseException:  # not ready, or the caller interrupted: no server is left running either way
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 3)
        return self

    def _wait_until_ready(self, process: subprocess.Popen[bytes], deadline: float) -> None:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServerFailed(f"the server exited with code {process.returncode}: {self._quoted()}")
            if self._url is None:
                self._url = announced_url(self.output())
            if self._url is not None and self._ready(self):
                return
            time.sleep(_POLL_S)
        raise ServerFailed(f"the server was not ready after {self.ready_timeout:g} s: {self._quoted()}")

    def terminate(self) -> None:
        """SIGTERM, the graceful stop, without waiting for it (`stop` waits, and kills what lingers)."""
        if self.process is None:
            raise RuntimeError("the server has not been started")
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM, up to `grace` seconds to exit, then SIGKILL to what is left of its session; its exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=self.grace)
        # The leader if it lingered, and any worker it left behind (its session is its process group). The group
        # id stays taken while a member lives, so this reaches only what this server started.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        self._close_log()
        return process.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- what it printed ----------------------------------------------------------------------------------------
    def output(self) -> str:
        """Everything the server printed so far (also after it stopped)."""
        if self._kept is not None:
            return self._kept
        if self._log is not None and not self._log.closed:
            self._log.flush()
        path = self.log_path if self.log_path is not None else self._log_name()
        if path is None:
            return ""
        with contextlib.suppress(OSError):
            return path.read_text(errors="replace")
        return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        """Return once `text` appears in the server's output; AssertionError with the output if it does not."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared in the server log:\n{self.output()}")
            time.sleep(0.02)

    def _http_url(self) -> str:
        if self._url is None:
            raise RuntimeError("the server has not said where it listens yet: start() it first")
        return self._url

    def _log_name(self) -> Path | None:
        return Path(self._log.name) if self._log is not None else None

    def _close_log(self) -> None:
        if self._log is None or self._log.closed:
            return
        if self.log_path is None:
            self._kept = self.output()  # the temporary file is deleted on close
        self._log.close()

    def _quoted(self) -> str:
        text = self.output()
        cut = text[-_QUOTED_CHARS:]
        return f"its output{' (end)' if len(cut) < len(text) else ''}:\n{cut}"


class TwinserveServer(ServerProcess):
    """`python -m twinserve serve MODEL... --arch ARCH FLAG...` on loopback, on a port it binds and announces."""

    def __init__(
        self,
        models: Sequence[str],
        arch: str,
        *flags: str,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_path: Path | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        # `flags` come last, so that a caller's own --host or --port wins.
        args = [sys.executable, "-m", "twinserve", "serve", *models, "--arch", arch, "--host", "127.0.0.1"]
        args += ["--port", "0", *flags]
        super().__init__(args, env=env, cwd=cwd, log_path=log_path, ready_timeout=ready_timeout)

    def display_command(self) -> list[str]:
        """The command as a user would type it."""
        return ["twinserve", *self.args[3:]]


def _redis_answers(server: ServerProcess) -> bool:
    import redis

    client = redis.Redis(port=server.port, socket_connect_timeout=2.0)
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    finally:
        client.close()


class RedisServer(ServerProcess):
    """A throwaway `redis-server` on a free loopback port, no persistence (the feature-store example's store).

    Started on construction, as the tests' fixtures and scripts expect; `url` is its `redis://` address.
    """

    def __init__(self, *, ready_timeout: float = 30.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        port = free_port()  # redis-server's --port 0 means "no TCP at all"
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        super().__init__(args, port=port, ready=_redis_answers, ready_timeout=ready_timeout, grace=10.0)
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class PrometheusServer(ServerProcess):
    """A throwaway Prometheus on a free loopback port scraping `targets` (`host:port`) every `scrape_interval_s`
    as job `job`, evaluating `rule_files` as often, its data in `directory` (which the caller removes).

    Ready once `/-/ready` answers 200; `query` asks its HTTP API.
    """

    def __init__(
        self,
        targets: Sequence[str],
        directory: Path,
        *,
        job: str = "twinserve",
        rule_files: Sequence[Path] = (),
        scrape_interval_s: float = 1.0,
        ready_timeout: float = 60.0,
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (apt-get install -y prometheus)")
        interval = f"{round(scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
        }
        directory.mkdir(parents=True, exist_ok=True)
        config_path = directory / "prometheus.yml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        port = free_port()  # Prometheus cannot bind port 0 and say which port it got
        args = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        super().__init__(args, port=port, ready=http_ready("/-/ready"), ready_timeout=ready_timeout, grace=10.0)

    def query(self, expr: str, *, at: float | None = None) -> Any:
        """The `data` of an instant query (`/api/v1/query`); raises if Prometheus answers anything but success."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        answer = loopback().get(self.url + "/api/v1/query", params=params, timeout=30.0).json()
        if answer.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {expr!r}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]


def request_bodies(
    base_url: str, payload: Path | None, headers: Mapping[str, str] | None = None, model: str | None = None
) -> tuple[str, list[bytes]]:
    """`model`'s name (default: the first served model's), and request bodies: one per `--payload` line, else one
    per example. `headers` go with the look-ups (an API key)."""
    with httpx.Client(timeout=30, headers=dict(headers or {})) as client:
        name: str = model or client.get(base_url + "/v1/models").json()["models"][0]  # KServe V1's listing: names
        if payload is not None:
            lines = [line.strip() for line in payload.read_bytes().splitlines() if line.strip()]
            bodies = [orjson.dumps(orjson.loads(line)) for line in lines]
            if not bodies:
                raise ValueError(f"{payload}: no request bodies (one JSON object per line)")
            return name, bodies
        examples: list[Any] = client.get(f"{base_url}/v1/models/{name}").json().get("examples") or []
    if not examples:
        raise ValueError(f"model {name!r} has no examples(): pass --payload FILE (one request body per line)")
    return name, [orjson.dumps({"instances": [example]}) for example in examples]
