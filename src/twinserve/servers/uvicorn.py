"""The async architecture's server: the FastAPI front under uvicorn with uvloop and httptools (S11)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import signal
import sys
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from twinserve.config import Config
from twinserve.core.runtime import load_runtimes
from twinserve.errors import HeadersTooLarge, TwinserveError, UriTooLong
from twinserve.fronts.asgi import create_asgi_app
from twinserve.fronts.contract import Service, raw_error_response
from twinserve.fronts.websocket import Streams
from twinserve.observability.logging import configure_logging
from twinserve.observability.metrics import start_memory_sampler
from twinserve.observability.tracing import setup_tracing

__all__ = ["LimitedHttpToolsProtocol", "app_factory", "run"]

#: uvicorn's worker processes are spawned, not forked: they rebuild the Config from this variable.
CONFIG_ENV = "TWINSERVE_SERVE_CONFIG_JSON"


def app_factory() -> ASGIApp:
    """Build the app in this process (models load in its lifespan) from the Config `run` handed down."""
    config = Config.model_validate_json(os.environ[CONFIG_ENV])
    configure_logging(config.log_level, config.log_format)
    start_memory_sampler("server")
    streams = Streams()
    _DrainStreamsFirst(streams, config.graceful_timeout).install()
    logging.getLogger("uvicorn.error").addFilter(_refused_handshake_noise)
    return create_asgi_app(Service(load_runtimes(config), config, setup_tracing(config)), streams)


def _refused_handshake_noise(record: logging.LogRecord) -> bool:
    """uvicorn's websockets-sansio protocol logs this error after every handshake refused with an HTTP response
    (ASGI's denial-response extension), the way twinserve answers an unknown model's stream; the refusal itself is
    logged as a request. Every other WebSocket endpoint path accepts or refuses, so the line says nothing here."""
    return record.getMessage() != "ASGI callable returned without completing handshake."


class _DrainStreamsFirst:
    """Put the WebSocket drain in front of uvicorn's own shutdown.

    On SIGINT/SIGTERM uvicorn closes every WebSocket at once (code 1012), dropping answers already being computed.
    This handler takes the signal first: open streams stop taking messages, send the answers they owe (within the
    graceful timeout) and close with 1001; then uvicorn gets the signal and shuts down as usual. With no stream
    open the signal goes straight to uvicorn. Installed while uvicorn loads the app, inside its signal capture.
    """

    def __init__(self, streams: Streams, timeout: float) -> None:
        self.streams = streams
        self.timeout = timeout
        self.loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:  # built outside uvicorn's serving loop: its signals are not ours to take
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            forward = signal.getsignal(sig)
            if callable(forward):
                signal.signal(sig, functools.partial(self._on_signal, forward))

    def _on_signal(self, forward: Any, signum: int, frame: FrameType | None) -> None:
        if self.streams.closing or not len(self.streams):
            forward(signum, frame)  # nothing to drain, or a second signal: stop now
            return
        self.streams.closing = True
        assert self.loop is not None
        # A signal handler may interrupt the loop anywhere: only the thread-safe entry point is safe here.
        self.loop.call_soon_threadsafe(self._drain, forward, signum)

    def _drain(self, forward: Any, signum: int) -> None:
        assert self.loop is not None
        task = self.loop.create_task(self.streams.aclose(self.timeout))
        task.add_done_callback(lambda _: forward(signum, None))


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request past a limit."""


@functools.cache
def _limits() -> Config:
    return Config.model_validate_json(os.environ[CONFIG_ENV])


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request-line and header limits gunicorn enforces (414, 431).

    llhttp sets no limit of its own, and httptools buffers a header until it is complete, so without these a
    client could send one header without end. The bytes of a request's head are therefore bounded as they arrive:
    the whole head may not exceed the request line plus the header fields allowed, each at its longest.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = _limits()
        self._max_line = limits.max_request_line
        self._max_count = limits.max_header_count
        self._max_field = limits.max_header_bytes
        self._max_head = limits.max_request_line + limits.max_header_count * (limits.max_header_bytes + 2)
        self._head_bytes = 0
        self._header_count = 0
        self._in_head = True
        self._refusal: TwinserveError | None = None

    def data_received(self, data: bytes) -> None:
        counting = self._in_head
        super().data_received(data)
        # Counted after parsing, so a chunk that ends the head and carries a large body is not held against it;
        # what httptools buffers stays bounded by the limit plus one read.
        if counting and self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head:
                self._refuse(self._too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self._max_line:
            self._refusal = UriTooLong("the request line is longer than the server accepts (--max-request-line)")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._max_count or len(name) + len(value) + 2 > self._max_field:
            self._refusal = self._too_large()
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error, ours included, with this 400; a refusal gets its own status.
        if self._refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._refusal)

    def _refuse(self, error: TwinserveError) -> None:
        if not self.transport.is_closing():
            self.transport.write(raw_error_response(error))
            self.transport.close()

    @staticmethod
    def _too_large() -> HeadersTooLarge:
        return HeadersTooLarge(
            "the request has too many header fields or one too long (--max-header-count, --max-header-bytes)"
        )


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
        http=LimitedHttpToolsProtocol,
        lifespan="on",
        log_config=None,  # uvicorn's loggers propagate to the pipeline configure_logging set up
        log_level=config.log_level,
        access_log=False,  # twinserve logs each request once, with its id, batch size and queue wait
        timeout_graceful_shutdown=math.ceil(config.graceful_timeout),
        ws="websockets-sansio",
        ws_max_size=config.effective_ws_max_message_bytes,  # larger messages: close 1009
        ws_ping_interval=20.0,  # keepalive pings find dead peers; a stream may be idle for long
        ws_ping_timeout=20.0,
    )
