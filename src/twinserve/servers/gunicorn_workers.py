"""gunicorn worker classes for the sync architecture: load shedding, slow-client bounds, JSON limit errors."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.http.errors import LimitRequestHeaders, LimitRequestLine
from gunicorn.workers import gthread, sync

from twinserve.errors import HeadersTooLarge, TwinserveError, UriTooLong
from twinserve.fronts.contract import raw_error_response
from twinserve.fronts.wsgi import BACKLOG_ENVIRON

__all__ = ["WORKER_CLASSES", "WORKER_CONNECTIONS", "SheddingThreadWorker", "SyncWorker"]

#: Connections a gthread worker holds open at most (gunicorn's default), unless the queue bound needs more.
WORKER_CONNECTIONS = 1000


class _JsonLimitErrors:
    """gunicorn answers a request line or header past its limits with 414/431 and a text body before the app
    sees the request; these workers send the same statuses with twinserve's JSON error body instead."""

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        error = _limit_error(exc)
        if error is None:
            super().handle_error(req, client, addr, exc)  # type: ignore[misc]
            return
        self.log.debug("refused a request: %s", error.message)  # type: ignore[attr-defined]
        with contextlib.suppress(OSError):
            client.sendall(raw_error_response(error))


def _limit_error(exc: BaseException) -> TwinserveError | None:
    if isinstance(exc, LimitRequestLine):
        return UriTooLong()
    if isinstance(exc, LimitRequestHeaders):
        return HeadersTooLarge()
    return None


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


class SheddingThreadWorker(_JsonLimitErrors, gthread.ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, plus load shedding, a read timeout and JSON bodies for its limit errors.

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


class SyncWorker(_JsonLimitErrors, sync.SyncWorker):  # type: ignore[misc]
    """gunicorn's sync worker (one request at a time) with JSON bodies for its limit errors."""


WORKER_CLASSES = {"gthread": SheddingThreadWorker, "sync": SyncWorker}
