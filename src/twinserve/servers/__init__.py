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
    "sync": "twinserve.servers.sync.server:run",
    "async": "twinserve.servers.asgi.server:run",
    "hybrid": "twinserve.servers.asgi.server:run",  # the async front; Config routes predict to model-worker processes
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


def _served(config: Config, base: str) -> tuple[str, list[str], str | None]:
    """What the server serves, for a person; the models, for a program (MODEL arguments as given, a repository's
    model names as its index lists them); a curl line to try, if there is one."""
    repository = config.model_repository
    if repository is not None:
        from twinserve.repository.layout import read_repository

        try:
            models = [folder.name for folder in read_repository(repository)]
        except OSError:  # the workers read it again and report what is wrong with it; this is only a hint
            return f"the model repository {repository}", [], None
        served = f"{', '.join(models)} from" if models else "no models yet from"
        return f"{served} the model repository {repository}", models, None
    try:
        spec = ModelSpec(import_model(config.models[0])())
    except Exception:  # the workers load the model and report what is wrong with it; this is only a hint
        return config.models[0], list(config.models), None
    return spec.name, list(config.models), _curl(base, spec)


def announce(config: Config, port: int) -> None:
    """Say where the server listens and how to try it: plain lines on a terminal, else one JSON log event.

    `port` is the one bound, the kernel's choice when `config.port` is 0: said once the socket is bound, so that
    whoever started the server (`twinserve.lab.servers`, a script) can read the real address from this line."""
    import structlog

    from twinserve.observability.logging import for_console

    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    grpc = None if config.grpc_port is None else f"{'[' + host + ']' if ':' in host else host}:{config.grpc_port}"
    name, models, curl = _served(config, base)
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
        "serving",
        arch=config.arch,
        url=base,
        models=models,
        repository=None if config.model_repository is None else str(config.model_repository),
        curl=curl,
        grpc=grpc,
    )


def serve(config: Config) -> None:
    """Serve `config.models` in `config.arch` until SIGTERM/SIGINT. Bad MODELs, tracing that cannot work here, or a
    --device that is not here, fail before a port is bound; a model that fails to load in a worker process stops
    the server with `StartupFailed`, its one-line reason (servers/startup.py)."""
    check_tracing(config)
    resolve_device(config.device)
    if config.model_repository is None:  # a repository's bad models are their own: the others still serve
        for target in config.models:
            model_class = import_model(target)
            label = getattr(model_class, "name", None) or model_class.__name__.lower()
            model_config(config, class_settings(model_class), label)  # per-model settings checked here too
    _share_admission_state(config)
    if config.effective_workers > 1:
        from twinserve.core import readiness

        readiness.create()  # each server process is ready once every one has loaded its models
    if config.model_repository is not None and config.model_control == "explicit" and config.effective_workers > 1:
        from twinserve.repository import desired

        desired.create()  # every server process follows the explicit loads and unloads any one of them takes
    from twinserve.servers.startup import StartupReport

    report = StartupReport()  # where a worker process that cannot start says why (servers/startup.py)
    try:
        _runner(config.arch)(_grpc_port_chosen(config))
    except BaseException:  # its exit status, or gunicorn's HaltServer raised again when two workers fail at once
        report.check()  # a worker said why the server stopped: that, not the bare exit status or a traceback
        raise
    report.check()  # uvicorn's supervisor of several workers returns once one of them failed to start


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
