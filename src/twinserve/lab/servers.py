"""A model server under test: `twinserve serve` started as a user would start it, watched from outside."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx
import orjson

__all__ = ["ServerFailed", "ServerProcess", "free_port", "request_bodies"]


class ServerFailed(RuntimeError):
    """The server exited, or never became ready; the message ends with the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """`python -m twinserve serve MODEL --arch ARCH ...` on a free loopback port, its output in `log_path`."""

    def __init__(self, model: str, arch: str, settings: dict[str, Any], log_path: Path, ready_timeout: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "twinserve", "serve", model, "--arch", arch]
        for name, value in settings.items():
            if value is not None:
                self.command += ["--" + name.replace("_", "-"), str(value)]
        self.command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def display_command(self) -> list[str]:
        """The command as a user would type it."""
        return ["twinserve", *self.command[3:]]

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        started = time.monotonic()
        env = {**os.environ, "TWINSERVE_LOG_FORMAT": "json"}
        self.process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = started + self.ready_timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServerFailed(f"the server exited with code {self.process.returncode}\n{self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(self.url + "/v2/health/ready").status_code == 200:
                        self.startup_s = round(time.monotonic() - started, 3)
                        return self
                time.sleep(0.1)
        self.stop()
        raise ServerFailed(f"the server was not ready after {self.ready_timeout:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """SIGTERM (a graceful stop), then SIGKILL to the server's own process group if it lingers."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # its own session: only what this server started
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def request_bodies(base_url: str, payload: Path | None) -> tuple[str, list[bytes]]:
    """The first served model's name, and request bodies: one per `--payload` line, else one per example."""
    with httpx.Client(timeout=30) as client:
        models = client.get(base_url + "/v1/models").json()["models"]
        name: str = models[0]["name"]
        if payload is not None:
            lines = [line.strip() for line in payload.read_bytes().splitlines() if line.strip()]
            bodies = [orjson.dumps(orjson.loads(line)) for line in lines]
            if not bodies:
                raise ValueError(f"{payload}: no request bodies (one JSON object per line)")
            return name, bodies
        examples = client.get(f"{base_url}/v1/models/{name}").json().get("examples") or []
    if not examples:
        raise ValueError(f"model {name!r} has no examples(): pass --payload FILE (one request body per line)")
    return name, [orjson.dumps({"instances": [example]}) for example in examples]
