"""Server runners, one per architecture, chosen by name from one registry."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from twinserve.config import Config
from twinserve.model import import_model
from twinserve.observability.tracing import check_tracing

__all__ = ["SERVERS", "serve"]

#: `--arch` name -> the runner that serves a Config in that architecture (imported only when chosen).
SERVERS: dict[str, str] = {
    "sync": "twinserve.servers.gunicorn:run",
    "async": "twinserve.servers.uvicorn:run",
    "hybrid": "twinserve.servers.uvicorn:run",  # the async front; Config routes predict to model-worker processes
}


def _runner(arch: str) -> Callable[[Config], None]:
    module, _, attr = SERVERS[arch].partition(":")
    runner: Callable[[Config], None] = getattr(importlib.import_module(module), attr)
    return runner


def serve(config: Config) -> None:
    """Serve `config.models` in `config.arch` until SIGTERM/SIGINT. Bad MODELs, or tracing that cannot work here,
    fail before a port is bound."""
    check_tracing(config)
    for target in config.models:
        import_model(target)
    _runner(config.arch)(config)
