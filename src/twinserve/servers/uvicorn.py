"""The async architecture's server: the FastAPI front under uvicorn with uvloop and httptools (S11)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from twinserve.config import Config
from twinserve.core.runtime import load_runtimes
from twinserve.fronts.asgi import create_asgi_app
from twinserve.fronts.contract import Service
from twinserve.observability.logging import configure_logging
from twinserve.observability.metrics import start_memory_sampler
from twinserve.observability.tracing import setup_tracing

__all__ = ["app_factory", "run"]

#: uvicorn's worker processes are spawned, not forked: they rebuild the Config from this variable.
CONFIG_ENV = "TWINSERVE_SERVE_CONFIG_JSON"


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a bound on how long a request's head may take to arrive.

    uvicorn times out idle kept-alive connections but not a client that opens a connection and sends its request
    line and headers a byte at a time (slowloris): such a connection is closed after `--read-timeout-s`. A slow
    body is the front's to bound (it answers 408).
    """

    read_timeout: float = 30.0  # set from the Config in each worker process by `app_factory`
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.read_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def app_factory() -> ASGIApp:
    """Build the app in this process (models load in its lifespan) from the Config `run` handed down."""
    config = Config.model_validate_json(os.environ[CONFIG_ENV])
    BoundedHttpToolsProtocol.read_timeout = config.read_timeout_s
    configure_logging(config.log_level, config.log_format)
    start_memory_sampler("server")
    return create_asgi_app(Service(load_runtimes(config), config, setup_tracing(config)))


def _exit_cleanly(signum: int, frame: object) -> None:
    sys.exit(0)


def run(config: Config) -> None:
    os.environ[CONFIG_ENV] = config.model_dump_json()
    configure_logging(config.log_level, config.log_format)
    # uvicorn re-raises the SIGTERM it caught once shutdown is done; a graceful stop should exit 0, as gunicorn's does.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(
        "twinserve.servers.uvicorn:app_factory",
        factory=True,
        host=config.host,
        port=config.port,
        workers=config.effective_workers,
        loop="uvloop",
        http=BoundedHttpToolsProtocol,
        lifespan="on",
        log_config=None,  # uvicorn's loggers propagate to the pipeline configure_logging set up
        log_level=config.log_level,
        access_log=False,  # twinserve logs each request once, with its id, batch size and queue wait
        timeout_graceful_shutdown=math.ceil(config.graceful_timeout),
    )
