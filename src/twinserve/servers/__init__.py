"""Server runners, one per architecture, chosen by name from one registry."""

from __future__ import annotations

import importlib
import shlex
import sys
from collections.abc import Callable

from twinserve.config import Config
from twinserve.core.device import resolve_device
from twinserve.core.settings import class_settings, model_config
from twinserve.model import ModelSpec, import_model
from twinserve.observability.tracing import check_tracing

__all__ = ["SERVERS", "announce", "serve"]

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


def _curl(base: str, spec: ModelSpec) -> str | None:
    """A ready-to-paste predict request with the model's first example, or None if it has none."""
    import orjson

    from twinserve.protocol.v1 import json_default

    examples = spec.examples()
    if not examples:
        return None
    body = orjson.dumps({"instances": examples[:1]}, default=json_default).decode()
    url = f"{base}/v1/models/{spec.name}:predict"
    return f"curl -s {url} -H 'content-type: application/json' -d {shlex.quote(body)}"


def announce(config: Config, port: int) -> None:
    """Say where the server listens and how to try it: plain lines on a terminal, else one JSON log event.

    `port` is the one bound, the kernel's choice when `config.port` is 0: said once the socket is bound, so that
    whoever started the server (`twinserve.lab.servers`, a script) can read the real address from this line."""
    import structlog

    from twinserve.observability.logging import for_console

    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    grpc = None if config.grpc_port is None else f"{'[' + host + ']' if ':' in host else host}:{config.grpc_port}"
    try:
        if config.model_repository is not None:
            name, curl = f"the models of {config.model_repository}", None
        else:
            spec = ModelSpec(import_model(config.models[0])())
            name, curl = spec.name, _curl(base, spec)
    except Exception:  # the workers load the model and report what is wrong with it; this is only a hint
        name, curl = config.models[0], None
    if for_console(config.log_format):
        print(
            f"twinserve: serving {name} ({config.arch}) on {base}; ready once GET /v2/health/ready is 200",
            file=sys.stderr,
        )
        if curl:
            print(f"try: {curl}", file=sys.stderr)
        if grpc is not None:
            print(f"twinserve: gRPC (inference.GRPCInferenceService) on {grpc}", file=sys.stderr)
        return
    structlog.get_logger().bind(logger="twinserve.serve").info(
        "serving", arch=config.arch, url=base, models=list(config.models), curl=curl, grpc=grpc
    )


def serve(config: Config) -> None:
    """Serve `config.models` in `config.arch` until SIGTERM/SIGINT. Bad MODELs, tracing that cannot work here, or a
    --device that is not here, fail before a port is bound."""
    check_tracing(config)
    resolve_device(config.device)
    if config.model_repository is None:  # a repository's bad models are their own: the others still serve
        for target in config.models:
            model_class = import_model(target)
            label = getattr(model_class, "name", None) or model_class.__name__.lower()
            model_config(config, class_settings(model_class), label)  # per-model settings checked here too
    _share_admission_state(config)
    if config.model_repository is not None and config.model_control == "explicit" and config.effective_workers > 1:
        from twinserve.repository import desired

        desired.create()  # every server process follows the explicit loads and unloads any one of them takes
    _runner(config.arch)(_grpc_port_chosen(config))


def _grpc_port_chosen(config: Config) -> Config:
    """`--grpc-port 0` resolved here, once: every worker process binds the same port (SO_REUSEPORT), so the kernel
    must not pick one per worker. The port is free when chosen; the workers bind it moments later."""
    if config.grpc_port != 0:
        return config
    import socket

    with socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET) as probe:
        probe.bind((config.host, 0))
        port = probe.getsockname()[1]
    return config.model_copy(update={"grpc_port": port})


def _share_admission_state(config: Config) -> None:
    """Make the slots the worker processes' rate limits share, so that a limit holds for the whole server."""
    from twinserve.core import shared
    from twinserve.core.admission import shared_slot_count

    keys = len(set(config.all_api_keys())) if config.auth_enabled else 0
    count = shared_slot_count(config, keys)
    if count and config.effective_workers > 1:
        shared.create(count)
