"""The async architecture's server: the ASGI front under uvicorn with uvloop and httptools (S11)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import signal
import socket
import sys
from types import FrameType
from typing import Any, cast

import uvicorn
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from twinserve.config import Config
from twinserve.core.heap import settle
from twinserve.fronts.asgi import create_asgi_app
from twinserve.fronts.websocket import OpenSockets
from twinserve.observability.logging import configure_logging
from twinserve.observability.metrics import start_memory_sampler
from twinserve.observability.tracing import setup_tracing
from twinserve.repository import ModelRegistry
from twinserve.servers import announce
from twinserve.servers.asgi.accept import listen_on
from twinserve.servers.asgi.listeners import balanced_listener
from twinserve.servers.asgi.protocol import BoundedHttpToolsProtocol
from twinserve.servers.served import Served
from twinserve.servers.startup import built_or_exit, report_failure, stop_server
from twinserve.service.contract import Service

__all__ = ["AppFactory", "run"]


class AppFactory:
    """The ASGI app's factory handed to uvicorn (`factory=True`): it builds the app over `served`'s Config in the
    process that serves it, and fills `served` with what the server's protocol needs (servers/served.py). Picklable,
    as uvicorn's Config is pickled into each worker process it spawns.

    A model that cannot be built here ends this process with uvicorn's STARTUP_FAILURE, which stops its supervisor
    of several workers too, after its one line went to the start-up report (servers/startup.py). The models load in
    a task of the lifespan that completes at once, so the server answers while they load (live, not ready); one of
    the MODEL arguments that fails to load stops the server with SIGTERM, uvicorn's graceful stop, after the same
    report: this process with one worker, the supervisor, its parent, with several. Built outside uvicorn's
    serving loop (the tests' in-process apps), the models load before the lifespan's startup completes."""

    def __init__(self, served: Served) -> None:
        self.served = served

    def __call__(self) -> ASGIApp:
        config = self.served.config
        configure_logging(config.log_level, config.log_format)
        start_memory_sampler("server")
        sockets = OpenSockets()
        serving = _DrainSocketsFirst(sockets, config.graceful_timeout).install()
        logging.getLogger("uvicorn.error").addFilter(_refused_handshake_noise)
        service = built_or_exit(
            lambda: Service(ModelRegistry.from_config(config), config, setup_tracing(config)), STARTUP_FAILURE
        )
        self.served.serve(service)
        server_pid = os.getpid() if config.effective_workers == 1 else os.getppid()
        return create_asgi_app(
            service,
            sockets,
            on_ready=settle,
            on_startup_failure=report_failure,
            on_load_failure=functools.partial(stop_server, server_pid=server_pid) if serving else None,
        )


def _refused_handshake_noise(record: logging.LogRecord) -> bool:
    """uvicorn's websockets-sansio protocol logs this error after every handshake refused with an HTTP response
    (ASGI's denial-response extension), the way twinserve answers an unknown model's stream; the refusal itself is
    logged as a request. Every other WebSocket endpoint path accepts or refuses, so the line says nothing here."""
    return record.getMessage() != "ASGI callable returned without completing handshake."


class _DrainSocketsFirst:
    """Put the WebSocket drain in front of uvicorn's own shutdown.

    On SIGINT/SIGTERM uvicorn closes every WebSocket at once (code 1012), dropping answers already being computed.
    This handler takes the signal first: open sockets stop taking messages, send the answers they owe (within the
    graceful timeout) and close with 1001; then uvicorn gets the signal and shuts down as usual. With no stream
    open the signal goes straight to uvicorn. Installed while uvicorn loads the app, inside its signal capture.
    """

    def __init__(self, sockets: OpenSockets, timeout: float) -> None:
        self.sockets = sockets
        self.timeout = timeout
        self.loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> bool:
        """Take the signals; False when built outside uvicorn's serving loop: its signals are not ours to take."""
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        for sig in (signal.SIGINT, signal.SIGTERM):
            forward = signal.getsignal(sig)
            if callable(forward):
                signal.signal(sig, functools.partial(self._on_signal, forward))
        return True

    def _on_signal(self, forward: Any, signum: int, frame: FrameType | None) -> None:
        if self.sockets.closing or not len(self.sockets):
            forward(signum, frame)  # nothing to drain, or a second signal: stop now
            return
        self.sockets.closing = True
        assert self.loop is not None
        # A signal handler may interrupt the loop anywhere: only the thread-safe entry point is safe here.
        self.loop.call_soon_threadsafe(self._drain, forward, signum)

    def _drain(self, forward: Any, signum: int) -> None:
        assert self.loop is not None
        task = self.loop.create_task(self.sockets.aclose(self.timeout))
        task.add_done_callback(lambda _: forward(signum, None))


def _listener(config: Config) -> socket.socket | None:
    try:
        sock = balanced_listener(config.host, config.port)
    except OSError as exc:  # what uvicorn's own bind does: the address in use, say
        logging.getLogger("uvicorn.error").error(exc)
        sys.exit(STARTUP_FAILURE)
    if sock is not None:
        logging.getLogger("uvicorn.error").info(
            "Uvicorn running on http://%s:%d, one socket per worker (SO_REUSEPORT)", config.host, sock.getsockname()[1]
        )
    return sock


def _exit_cleanly(signum: int, frame: object) -> None:
    sys.exit(0)


def run(config: Config) -> None:
    configure_logging(config.log_level, config.log_format)
    # uvicorn re-raises the SIGTERM it caught once shutdown is done; a graceful stop should exit 0, as gunicorn's does.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    # The app factory and the protocol hold the same `Served`: uvicorn's worker processes get both in one pickle of
    # its Config, so each worker's protocol counts what it refuses on the service that worker's app built.
    served = Served(config)
    protocol = functools.partial(BoundedHttpToolsProtocol, served=served)
    settings = uvicorn.Config(
        AppFactory(served),
        factory=True,
        host=config.host,
        port=config.port,
        workers=config.effective_workers,
        loop="uvloop",
        # uvicorn's httptools protocol with a head deadline and limits (servers/asgi/protocol.py).
        http=cast(type[asyncio.Protocol], protocol),
        lifespan="on",
        log_config=None,  # uvicorn's loggers propagate to the pipeline configure_logging set up
        log_level=config.log_level,
        access_log=False,  # twinserve logs each request once, with its id, batch size and queue wait
        timeout_graceful_shutdown=math.ceil(config.graceful_timeout),
        ws="websockets-sansio",
        ws_max_size=config.effective_ws_max_message_bytes,  # larger messages: close 1009
        ws_ping_interval=20.0,  # keepalive pings find dead peers; a stream may be idle for long
        ws_ping_timeout=20.0,
        # The client's address is the front's to work out (`service/clients.py`, from --forwarded-allow-ips), the
        # same way in every architecture; uvicorn's own rewrite would trust its FORWARDED_ALLOW_IPS instead.
        proxy_headers=False,
    )
    # What `uvicorn.run` does, with the socket bound here first (as uvicorn binds it for several workers) so that
    # the announcement says the port bound, the kernel's choice for --port 0. Several workers each listen on a
    # socket of their own where the kernel spreads connections over them (servers/asgi/listeners.py).
    sock = _listener(config) if settings.workers > 1 else None
    if sock is None:
        sock = settings.bind_socket()
        if settings.workers == 1:  # served in this process: it accepts a burst at once (servers/asgi/accept.py)
            listen_on(sock)
    announce(config, sock.getsockname()[1])
    server = uvicorn.Server(settings)
    try:
        if settings.workers > 1:
            Multiprocess(settings, sockets=[sock]).run()
        else:
            server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    if settings.workers == 1 and not server.started:
        sys.exit(STARTUP_FAILURE)  # the app failed its lifespan startup (a model that would not load)
