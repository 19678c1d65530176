"""The sync architecture's server: the Flask front under gunicorn (S1, S2), or one foreground thread (S6)."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.glogging import Logger

from twinserve.config import Config
from twinserve.core.heap import settle
from twinserve.fronts.wsgi import create_wsgi_app
from twinserve.observability.logging import configure_logging
from twinserve.observability.metrics import mark_process_dead, record_death, start_memory_sampler
from twinserve.observability.tracing import setup_tracing, shutdown_tracing
from twinserve.repository import ModelRegistry
from twinserve.servers import announce
from twinserve.servers.served import Served
from twinserve.servers.startup import built_or_exit, stop_server
from twinserve.servers.sync.balance import ConnectionShares
from twinserve.servers.sync.exits import WorkerExits
from twinserve.servers.sync.signals import hold_across_forks, release
from twinserve.servers.sync.worker import RequestThreadsWorker
from twinserve.service.contract import Service

__all__ = ["WORKER_CONNECTIONS", "build_wsgi_app", "run"]

#: Connections a worker holds open at most (gunicorn's default), unless the queue bound needs more.
WORKER_CONNECTIONS = 1000


def build_wsgi_app(served: Served, on_load_failure: Callable[[BaseException], None] | None = None) -> Flask:
    """Import every model in this process (the per-worker singleton, S4) and build the app over them, from
    `served`'s Config; `served` gets the service, its refusal before the app, and the gRPC server once it starts.

    Without `on_load_failure` the models load before the app is returned (the debug server, the tests' in-process
    apps): a failure raises. With it they load on a thread of their own behind the app, which answers at once: live,
    and not ready until they have loaded (`ModelRegistry.starting`); a request for a model still loading waits for
    it (repository/residency.py). A model of the MODEL arguments that fails to load goes to `on_load_failure`: the
    server's to report and stop. The thread is a daemon: a worker told to stop while a model's `load()` still runs
    (nothing can interrupt it) exits without waiting for it.
    """
    config = served.config
    configure_logging(config.log_level, config.log_format)
    start_memory_sampler("server")
    tracer = setup_tracing(config)  # here, in the worker: the exporter's thread would not survive gunicorn's fork
    service = Service(load_models(config), config, tracer)
    served.serve(service)
    if on_load_failure is None:
        _load(service, served)
    else:
        service.registry.starting = True
        loading = threading.Thread(
            target=_load_behind, args=(service, served, on_load_failure), name="twinserve-first-load", daemon=True
        )
        loading.start()
    return create_wsgi_app(service)


def _load(service: Service, served: Served) -> None:
    """Load the models, then start what serves beside HTTP once they are loaded."""
    service.registry.load()
    if service.watch is not None:  # the repository's poll, or the other workers' explicit changes
        service.watch.start()
    if served.config.grpc_port is not None:
        from twinserve.fronts.grpc import GrpcThread  # imported only then: its stubs fill protobuf's global pool

        grpc = GrpcThread(service, served.config)
        grpc.start()
        served.grpc = grpc


def _load_behind(service: Service, served: Served, on_load_failure: Callable[[BaseException], None]) -> None:
    """`_load` behind a serving app (see `build_wsgi_app`); ready once it and the heap's settling are done."""
    try:
        _load(service, served)
        settle()  # its models loaded: the worker serves from here (core/heap.py)
    except Exception as exc:
        on_load_failure(exc)
        return
    service.started()


def load_models(config: Config) -> ModelRegistry:
    """The models this worker serves: MODEL arguments' or the model repository's (imported, not yet loaded)."""
    return ModelRegistry.from_config(config)


#: The arbiter's record of its workers' exits (the `child_exit` hook, which may run in a signal handler: exits.py).
_exits = WorkerExits(on_death=record_death, on_stop=mark_process_dead)


def _child_exit(server: Any, worker: Any) -> None:
    shares = getattr(server.app, "connection_shares", None)
    if shares is not None:
        shares.release(worker)  # one store into shared memory: safe in a signal handler
    # The arbiter empties LISTENERS as it starts to stop: a worker that exits before that was not stopped by the
    # server (killed, crashed, timed out), and counts as a death.
    _exits.exited(worker.pid, died=bool(server.LISTENERS))


def _worker_exit(server: Any, worker: Any) -> None:
    grpc = worker.app.served.grpc  # the worker's copy of the application (`GunicornServer`): its own gRPC server
    if grpc is not None:  # after gunicorn's own drain of HTTP: gRPC calls in flight get the same grace
        grpc.stop(server.cfg.graceful_timeout)
    shutdown_tracing()  # in the exiting worker: export the spans it still holds


class _GunicornLogger(Logger):  # type: ignore[misc]
    """gunicorn's own messages through twinserve's pipeline; its access log stays off (requests are logged once)."""

    def setup(self, cfg: Any) -> None:
        self.error_log.setLevel(self.LOG_LEVELS.get(cfg.loglevel.lower(), logging.INFO))
        self.error_log.propagate = True
        self.access_log.disabled = True


class GunicornServer(BaseApplication):  # type: ignore[misc]
    """gunicorn driven programmatically: no config file, settings from `Config`, app built in each worker.

    Each worker, forked with its copy of this application, builds its app into its copy of `served`, which its
    `RequestThreadsWorker` and the `worker_exit` hook read (servers/served.py)."""

    def __init__(self, config: Config) -> None:
        self.served = Served(config)
        workers = config.effective_workers
        # The threaded workers' open connections, shared so that a worker leaves new ones to a less loaded one; room
        # for a graceful reload's new workers beside the old.
        threaded = config.worker_class == "gthread" and workers > 1
        self.connection_shares = ConnectionShares(2 * workers) if threaded else None
        super().__init__()

    def load_config(self) -> None:
        config = self.served.config
        threads = 1 if config.worker_class == "sync" else config.threads  # `sync`: one request at a time
        settings: dict[str, Any] = {
            "bind": [f"{config.host}:{config.port}"],
            "workers": config.effective_workers,
            # twinserve's own worker on gunicorn's worker API (servers/sync/worker.py), for both --worker-class
            # values: `gthread`, request threads; `sync`, one request at a time in the worker's main thread.
            "worker_class": RequestThreadsWorker,
            "threads": threads,
            # Enough open connections per worker for the queue bound to be reached, and so to shed (503), before
            # the worker stops accepting and leaves connections unanswered in the kernel's backlog.
            "worker_connections": max(WORKER_CONNECTIONS, threads + config.max_queue + 1),
            "graceful_timeout": math.ceil(config.graceful_timeout),  # gunicorn takes whole seconds
            "loglevel": config.log_level,
            "proc_name": "twinserve-sync",
            "preload_app": False,
            "accesslog": None,
            "logger_class": _GunicornLogger,
        }
        settings["when_ready"] = lambda arbiter: announce(config, arbiter.LISTENERS[0].getsockname()[1])
        settings["child_exit"] = _child_exit
        if self.connection_shares is not None:
            settings["pre_fork"] = lambda arbiter, worker: self.connection_shares.claim(worker)
        settings["worker_exit"] = _worker_exit
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 25: no shared ~/.gunicorn socket
            settings["control_socket_disable"] = True
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        # A worker whose models cannot be built exits as gunicorn's own workers do when they cannot boot (its ASGI
        # worker raises SystemExit(WORKER_BOOT_ERROR) for a failed lifespan): the arbiter stops the server instead of
        # booting the worker again, and the reason is the start-up report's (servers/startup.py). Its models load
        # once it serves (live, not ready): one of the MODEL arguments that fails to load stops the arbiter, its
        # parent, with SIGTERM, after the same report.
        return built_or_exit(lambda: build_wsgi_app(self.served, _stop_arbiter), Arbiter.WORKER_BOOT_ERROR)


def _stop_arbiter(error: BaseException) -> None:
    stop_server(error, os.getppid())  # a gunicorn worker's parent is its arbiter


def run(config: Config) -> None:
    configure_logging(config.log_level, config.log_format)
    if config.debug:
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                pass  # twinserve's request log has the request already

        # One process, one thread, no reloader: a breakpoint() in the model stops right here in the terminal.
        app = built_or_exit(lambda: build_wsgi_app(Served(config)), Arbiter.WORKER_BOOT_ERROR)
        server = make_server(config.host, config.port, app, threaded=False, request_handler=Quiet)
        announce(config, server.port)  # the port bound: the kernel's choice for --port 0
        server.serve_forever()
        return
    # A process exec'd by a fork of this one (gunicorn's USR2 re-exec) starts with the fork's mask: unblocked here.
    release()
    hold_across_forks()  # a signal sent to a worker before its handlers are in place waits for them (signals.py)
    # Announced once gunicorn has bound its socket (`when_ready`), with the port it got.
    GunicornServer(config).run()
