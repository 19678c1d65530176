"""gunicorn worker classes for the sync architecture: load shedding, read deadlines, JSON parser errors."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.workers import gthread, sync

from twinserve.core.admission import Admission
from twinserve.fronts.contract import raw_error_response
from twinserve.fronts.early import EARLY_REFUSAL_STATE, EarlyRefusal, Refusal
from twinserve.fronts.wsgi import BACKLOG_ENVIRON
from twinserve.servers.gunicorn_balance import BalancedAccept
from twinserve.servers.gunicorn_early import front_answer
from twinserve.servers.gunicorn_poller import PollerAdmission
from twinserve.servers.gunicorn_reads import (
    BodyInput,
    adopt,
    done_reading,
    parse_error,
    read_from_now,
    socket_class,
)

__all__ = ["WORKER_CLASSES", "WORKER_CONNECTIONS", "SheddingThreadWorker", "SyncWorker"]

#: Connections a gthread worker holds open at most (gunicorn's default), unless the queue bound needs more.
WORKER_CONNECTIONS = 1000

#: The GIL's switch interval in a gthread worker (CPython's default: 5 ms); see `init_process`.
SWITCH_INTERVAL_S = 0.001

#: How long gthread lets a new connection hold a request thread before its first byte.
DATA_WAIT_S: float = gthread.DEFAULT_WORKER_DATA_TIMEOUT

WsgiApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


class _TwinserveReads:
    """What both worker classes add to gunicorn's: the read deadlines and `wsgi.input` of gunicorn_reads.py, the
    JSON error body for every request gunicorn's parser refuses (gunicorn answers with its own HTML page), and
    an application's `Connection: close` honoured (gunicorn drops it as a hop-by-hop header)."""

    def init_reads(self) -> None:
        self._read_timeout = self.app.twinserve_config.read_timeout_s  # type: ignore[attr-defined]
        self._socket_class = socket_class(self._read_timeout)

    def wrap_wsgi(self, app: WsgiApp) -> WsgiApp:
        def with_reads(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            environ["wsgi.input"] = BodyInput(environ["wsgi.input"])
            return app(environ, _closing_on_request(start_response))

        return with_reads

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        error = parse_error(exc)
        if error is None:
            super().handle_error(req, client, addr, exc)  # type: ignore[misc]
            return
        self.log.debug("refused a request: %s (%s)", error.message, exc)  # type: ignore[attr-defined]
        if req is not None:
            # The head was parsed, so this came from draining a body the app did not read, after its answer: a
            # second response would be read as the next request's. The connection just closes.
            return
        with contextlib.suppress(OSError):
            client.sendall(raw_error_response(error))


def _closing_on_request(start_response: Any) -> Any:
    """`start_response`, closing the connection after a response whose headers ask for it (a 408, a 400 for bad
    framing: the rest of the connection cannot be trusted)."""
    # gunicorn's Response, which owns keep-alive; its force_close is public, how start_response reaches it is not.
    force_close = getattr(getattr(start_response, "__self__", None), "force_close", None)

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if force_close is not None and any(
            name.lower() == "connection" and value.lower() == "close" for name, value in headers
        ):
            force_close()
        return start_response(status, headers, exc_info)

    return start


def _early_refusal(app: Any) -> EarlyRefusal | None:
    """The refusal before the app that twinserve's Flask app publishes (fronts/early.py)."""
    early = getattr(app, "extensions", {}).get(EARLY_REFUSAL_STATE)
    return early if isinstance(early, EarlyRefusal) else None


def _refused(refusal: Refusal, start_response: Any) -> Iterable[bytes]:
    status, headers, body = front_answer(refusal)
    start_response(status, headers)
    return [body]


class SheddingThreadWorker(_TwinserveReads, BalancedAccept, PollerAdmission):
    """gunicorn's gthread worker, plus load shedding, read deadlines and JSON bodies for its parser errors.

    gthread queues every readable connection for its request threads without bound, so under overload requests
    wait longer and longer and clients time out instead of being told to retry. Here each request learns, when a
    thread takes it up, how many requests are still waiting for a thread behind it; the front answers 503 +
    Retry-After when that exceeds `--max-queue`, the same bound the batch queue applies in the other architectures
    (unless the poller already let it in, below). Each take-up also measures how fast the threads drain the
    backlog, from which its wait is estimated (`Admission.taken_up`).

    gthread reads a request's body in the request thread, and cannot hand a thread a request whose body is
    already in; the read deadlines (gunicorn_reads.py) bound how long a slow client holds that thread instead.

    A predict request the backlog or its model's batch queue refuses is answered before Flask runs
    (fronts/early.py): the front's own 503, built the way the front builds it; gunicorn discards its body. While
    the server is crowded, the poller looks at a request before any thread takes it up (gunicorn_poller.py): it
    refuses what the model's queue refuses, and holds the connection unread while the threads' own queue is full,
    releasing the highest priority first, so a crowd waits in TCP instead of costing the threads refusals. A
    worker holding more connections than another leaves new ones to it for a moment (gunicorn_balance.py), so that
    a burst of connections does not land on one worker while the others idle.
    """

    _drain: Admission | None = None

    def init_process(self) -> None:
        # The poller and every request thread contend for the GIL, and a thread that wants it back waits for the
        # interval before the holder is asked to let go. The poller keeps the threads' queue one request per thread
        # long (gunicorn_poller.py), so it must get the GIL soon to refill it and to release a held high priority.
        # overload.py, sync, goodput over capacity at CPython's 5 ms (one run): (a) 89-90%, (b) 76%, (c) 68%; at
        # 1 ms (two runs): (a) 98-105%, (b) 89-97%, (c) 78-97%; a high priority's P99 under a low crowd 165-190 ms
        # where it read 221-242. The cost: about 7% more CPU at one connection (116% of a core, not 109%), at the
        # same requests a second.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._local = threading.local()
        self.init_reads()
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        published = _early_refusal(self.wsgi)  # type: ignore[has-type]
        self._drain = None if published is None else published.service.admission
        early = self._early = published if published is not None and published.active else None  # the poller's too
        app: WsgiApp = self.wrap_wsgi(self.wsgi)  # type: ignore[has-type]
        local = self._local

        def with_backlog(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            backlog = environ[BACKLOG_ENVIRON] = getattr(local, "backlog", 0)
            if early is not None:
                refusal = early.refuse_environ(environ, backlog)
                if refusal is not None:  # Flask never sees it; gunicorn discards the unread body before the next
                    return _refused(refusal, start_response)
            return app(environ, start_response)

        self.wsgi = with_backlog

    def enqueue_req(self, conn: Any) -> None:
        adopt(conn.sock, self._socket_class)
        with self._waiting_lock:
            self._waiting += 1
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        with self._waiting_lock:
            self._waiting -= 1
            # One the poller let in has waited its turn (gunicorn_poller.py): the backlog behind it is not its wait.
            admitted, conn.admitted = getattr(conn, "admitted", False), False
            # Those answered without the model (an invalid priority) are no backlog (gunicorn_threads.py `QUICK`).
            self._local.backlog = 0 if admitted else min(self._waiting, self.tpool.counted())
            if self._drain is not None:  # the backlog's wait is measured from the take-ups (core/admission.py)
                self._drain.taken_up(time.monotonic(), self._waiting)
        # From when a thread takes the connection up: a new one's first bytes, a kept-alive one's next request.
        read_from_now(self._read_timeout, head=True)
        try:
            # gthread gives a new connection's first byte 5 s of a thread, then parks it in its poller; a shorter
            # read timeout closes a silent connection sooner, as it does a late head.
            silent = not conn.initialized and not conn.data_ready and self._read_timeout < DATA_WAIT_S
            if silent and not conn.wait_for_data(self._read_timeout):
                return False
            return super().handle(conn)
        finally:
            done_reading()

    def handle_request(self, req: Any, conn: Any) -> Any:
        read_from_now(self._read_timeout, head=False)  # the head is in: the body's own deadline starts
        return super().handle_request(req, conn)


class SyncWorker(_TwinserveReads, sync.SyncWorker):  # type: ignore[misc]
    """gunicorn's sync worker (one request at a time), with read deadlines and JSON bodies for its parser errors."""

    def init_process(self) -> None:
        self.init_reads()
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = self.wrap_wsgi(self.wsgi)  # type: ignore[has-type]

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        adopt(client, self._socket_class)
        client.setblocking(True)  # again, now that blocking means bounded
        read_from_now(self._read_timeout, head=True)
        try:
            super().handle(listener, client, addr)
        finally:
            done_reading()

    def handle_request(self, listener: Any, req: Any, client: Any, addr: Any) -> None:
        read_from_now(self._read_timeout, head=False)
        super().handle_request(listener, req, client, addr)


WORKER_CLASSES = {"gthread": SheddingThreadWorker, "sync": SyncWorker}
