"""The async architecture's server: the FastAPI front under uvicorn with uvloop and httptools (S11)."""

from __future__ import annotations

import math
import os
import signal
import sys

import uvicorn
from starlette.types import ASGIApp

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


def app_factory() -> ASGIApp:
    """Build the app in this process (models load in its lifespan) from the Config `run` handed down."""
    config = Config.model_validate_json(os.environ[CONFIG_ENV])
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
        http="httptools",
        lifespan="on",
        log_config=None,  # uvicorn's loggers propagate to the pipeline configure_logging set up
        log_level=config.log_level,
        access_log=False,  # twinserve logs each request once, with its id, batch size and queue wait
        timeout_graceful_shutdown=math.ceil(config.graceful_timeout),
    )
