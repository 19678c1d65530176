"""The sync architecture's server: the Flask front under gunicorn (S1, S2), or one foreground thread (S6)."""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger
from gunicorn.workers.gthread import ThreadWorker

from twinserve.config import Config
from twinserve.core.runtime import load_runtimes
from twinserve.fronts.contract import Service
from twinserve.fronts.wsgi import BACKLOG_ENVIRON, create_wsgi_app
from twinserve.observability.logging import configure_logging
from twinserve.observability.metrics import mark_process_dead, start_memory_sampler
from twinserve.observability.tracing import setup_tracing, shutdown_tracing

__all__ = ["SheddingThreadWorker", "build_wsgi_app", "run"]

#: Connections a gthread worker holds open at most (gunicorn's default), unless the queue bound needs more.
WORKER_CONNECTIONS = 1000


def build_wsgi_app(config: Config) -> Flask:
    """Import and load every model in this process (the per-worker singleton, S4), then build the app."""
    configure_logging(config.log_level, config.log_format)
    start_memory_sampler("server")
    tracer = setup_tracing(config)  # here, in the worker: the exporter's thread would not survive gunicorn's fork
    runtimes = load_runtimes(config)
    for runtime in runtimes.values():
        runtime.load()
    return create_wsgi_app(Service(runtimes, config, tracer))


def _child_exit(server: Any, worker: Any) -> None:
    mark_process_dead(worker.pid)  # a dead worker's live gauges leave the aggregate


def _worker_exit(server: Any, worker: Any) -> None:
    shutdown_tracing()  # in the exiting worker: export the spans it still holds


class _TimedSocket(socket.socket):
    """A connection whose blocking reads and writes give up after `read_timeout` seconds (TimeoutError).

    gthread switches each connection between non-blocking (in its poller) and blocking (in a request thread) with
    `setblocking`, which would clear a plain `settimeout`; here blocking means blocking with a bound, so a client
    that stalls mid-headers or mid-body (slowloris) cannot hold a request thread forever.
    """

    __slots__ = ()
    read_timeout: float = 30.0

    def setblocking(self, flag: bool) -> None:
        self.settimeout(type(self).read_timeout if flag else 0.0)


class SheddingThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, plus load shedding and a read timeout.

    gthread queues every readable connection for its request threads without bound, so under overload requests
    wait longer and longer and clients time out instead of being told to retry. Here each request learns, when a
    thread takes it up, how many requests are still waiting for a thread behind it; the front answers 503 +
    Retry-After when that exceeds `--max-queue`, the same bound the batch queue applies in the other architectures.
    """

    def init_process(self) -> None:
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._local = threading.local()
        self._read_timeout = read_timeout = self.app.twinserve_config.read_timeout_s
        self._socket_class = type("TimedSocket", (_TimedSocket,), {"__slots__": (), "read_timeout": read_timeout})
        #: Connections whose request head is being read, and when it must have arrived by.
        self._heads: dict[Any, float] = {}
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app: Callable[[dict[str, Any], Any], Iterable[bytes]] = self.wsgi  # type: ignore[has-type]
        local = self._local

        def with_backlog(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            environ[BACKLOG_ENVIRON] = getattr(local, "backlog", 0)
            return app(environ, start_response)

        self.wsgi = with_backlog

    def enqueue_req(self, conn: Any) -> None:
        if type(conn.sock) is socket.socket:
            conn.sock.__class__ = self._socket_class  # same layout: only setblocking changes
        with self._waiting_lock:
            self._waiting += 1
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        with self._waiting_lock:
            self._waiting -= 1
            self._local.backlog = self._waiting
        self._heads[conn] = time.monotonic() + self._read_timeout
        try:
            return super().handle(conn)
        finally:
            self._heads.pop(conn, None)

    def handle_request(self, req: Any, conn: Any) -> Any:
        self._heads.pop(conn, None)  # the head is in; the body is bounded per read by the socket timeout
        return super().handle_request(req, conn)

    def murder_keepalived(self, force: bool = False) -> None:
        """gthread's once-a-second housekeeping, plus: cut off a head that a client sends too slowly (slowloris).

        The socket timeout only bounds each pause, and a byte a second never pauses long; shutting the socket down
        wakes the request thread from its read, and gthread closes the connection.
        """
        super().murder_keepalived(force)
        now = time.monotonic()
        for conn, deadline in list(self._heads.items()):
            if now > deadline:
                self._heads.pop(conn, None)
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)


class _GunicornLogger(Logger):  # type: ignore[misc]
    """gunicorn's own messages through twinserve's pipeline; its access log stays off (requests are logged once)."""

    def setup(self, cfg: Any) -> None:
        self.error_log.setLevel(self.LOG_LEVELS.get(cfg.loglevel.lower(), logging.INFO))
        self.error_log.propagate = True
        self.access_log.disabled = True


class GunicornServer(BaseApplication):  # type: ignore[misc]
    """gunicorn driven programmatically: no config file, settings from `Config`, app built in each worker."""

    def __init__(self, config: Config) -> None:
        self.twinserve_config = config
        super().__init__()

    def load_config(self) -> None:
        config = self.twinserve_config
        # gunicorn silently turns `sync` into `gthread` when threads > 1; keep `sync` meaning one request at a time.
        threads = 1 if config.worker_class == "sync" else config.threads
        settings: dict[str, Any] = {
            "bind": [f"{config.host}:{config.port}"],
            "workers": config.effective_workers,
            "worker_class": SheddingThreadWorker if config.worker_class == "gthread" else "sync",
            "threads": threads,
            # Enough open connections per worker for the queue bound to be reached, and so to shed (503), before
            # gthread stops accepting and leaves connections unanswered in the kernel's backlog.
            "worker_connections": max(WORKER_CONNECTIONS, threads + config.max_queue + 1),
            "graceful_timeout": math.ceil(config.graceful_timeout),  # gunicorn takes whole seconds
            "loglevel": config.log_level,
            "proc_name": "twinserve-sync",
            "preload_app": False,
            "accesslog": None,
            "logger_class": _GunicornLogger,
        }
        settings["child_exit"] = _child_exit
        settings["worker_exit"] = _worker_exit
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 25: no shared ~/.gunicorn socket
            settings["control_socket_disable"] = True
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return build_wsgi_app(self.twinserve_config)


def run(config: Config) -> None:
    configure_logging(config.log_level, config.log_format)
    if config.debug:
        from werkzeug.serving import WSGIRequestHandler, run_simple

        class Quiet(WSGIRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                pass  # twinserve's request log has the request already

        # One process, one thread, no reloader: a breakpoint() in the model stops right here in the terminal.
        run_simple(
            config.host,
            config.port,
            build_wsgi_app(config),
            threaded=False,
            use_reloader=False,
            request_handler=Quiet,
        )
        return
    GunicornServer(config).run()
