"""The sync architecture's gunicorn worker: twinserve's own, on gunicorn's documented worker API.

gunicorn runs it as it runs any worker class (`worker_class`): the arbiter forks it, and it serves the WSGI app
gunicorn loaded (`self.wsgi`) on the listening sockets it was given (`self.sockets`), calling `notify()` as its
heartbeat and stopping when `alive` turns false (SIGTERM) within `graceful_timeout`. What it needs of the service
behind the app comes with its application (`self.app.served`, servers/served.py). Nothing else of gunicorn's
is used: no subclass of its gthread or sync workers, none of their internals (those change between releases).

One poller thread owns the sockets: it accepts, reads each request's head *and body* (servers/sync/http.py), and
hands whole requests to the request threads, which run the app and write its answer, then give a kept-alive
connection back. So a client that trickles its body holds a socket, not a thread; the threads take the highest
priority level waiting next (servers/sync/threads.py `LevelledThreadPool`); a request learns how many wait
behind it when a thread takes it up (the backlog the queue bound weighs, fronts/wsgi.py); and while requests wait
for a thread, a predict request its model's queue or the backlog refuses is answered by the poller from its head
(fronts/early.py), byte for byte the answer a thread gives, without costing a thread; one it lets in carries that
decision to the app, which does not decide it again.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import os
import selectors
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.workers.base import Worker

from twinserve.core.admission import Admission
from twinserve.errors import TwinserveError, internal_error
from twinserve.fronts.early import EarlyRefusal, Refusal
from twinserve.fronts.wsgi import BACKLOG_ENVIRON
from twinserve.servers.http1 import Limits, ParseError
from twinserve.servers.served import Served
from twinserve.servers.sync.admission import PollerAdmission
from twinserve.servers.sync.answers import front_answer
from twinserve.servers.sync.balance import Balance
from twinserve.servers.sync.connection import Connection, pass_order
from twinserve.servers.sync.http import Request, environ_of, response_head
from twinserve.servers.sync.input import BodyInput
from twinserve.servers.sync.response import ResponseWriter
from twinserve.servers.sync.signals import release
from twinserve.servers.sync.threads import QUICK, LevelledThreadPool
from twinserve.service.contract import raw_error_response
from twinserve.service.lifecycle import DECIDED

__all__ = ["RequestThreadsWorker"]

#: How much one read takes from a socket.
READ_BYTES = 65536
#: The poller's longest sleep: the heartbeat (`notify`) and the stop flag are looked at this often at least.
TICK_S = 0.5
#: Connections the poller accepts at most in one pass (the rest wait in the kernel's queue for the next).
ACCEPT_PER_PASS = 64

WsgiApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


class RequestThreadsWorker(Worker):  # type: ignore[misc]
    """A poller thread and `threads` request threads (see the module)."""

    def init_process(self) -> None:
        self._served: Served = self.app.served  # the application's (servers/sync/server.py `GunicornServer`)
        config = self._served.config
        self._read_timeout: float = config.read_timeout_s
        self._limits = Limits.of(config)
        self._threads = max(1, int(self.cfg.threads))
        self._keepalive = float(self.cfg.keepalive)
        self._max_connections = int(self.cfg.worker_connections)
        self._connections: dict[int, Connection] = {}
        self._timers: list[tuple[float, int, Connection]] = []
        self._order = itertools.count()
        #: Connections the threads hand back (and the poller's own answers), each to watch again (True) or close.
        self._returned: deque[tuple[Connection, bool]] = deque()
        self._busy = 0  # requests handed to the threads and not yet answered
        self._lock = threading.Lock()  # `_busy`, `nr`, and the backlog's take-ups
        self._early: EarlyRefusal | None = None
        self._admission: Admission | None = None
        self._multiprocess = int(self.cfg.workers) > 1
        # `--worker-class sync`: one request at a time, run by the poller itself in the worker's main thread (for a
        # model whose library must be called from there), as gunicorn's own sync worker ran it.
        self._inline = config.worker_class == "sync"
        # The arbiter's `pre_fork` hook gave this worker a slot in the shared counts (servers/sync/server.py).
        self._balance = Balance(getattr(self.app, "connection_shares", None), getattr(self, "connection_slot", None))
        super().init_process()  # loads the app (`load_wsgi`), then calls `run`

    def init_signals(self) -> None:
        super().init_signals()
        release()  # what the arbiter sent since the fork, held until now (servers/sync/signals.py)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        served = self._served  # filled as the app was built
        if served.service is not None:
            self._admission = served.service.admission
        if served.early is not None and served.early.active:
            self._early = served.early

    # -- the poller --------------------------------------------------------------------------------------------
    def run(self) -> None:
        address = self.sockets[0].getsockname()
        self._address = address[:2] if isinstance(address, tuple) else (str(address), 0)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        # A signal (SIGTERM: stop; SIGQUIT, SIGUSR1...) wakes the poller at once: Python retries an interrupted
        # select (PEP 475), so without this the loop saw `alive` turn false only at its next tick, and every stop
        # of a sync server waited up to TICK_S for nothing.
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for listener in self.sockets:
            listener.setblocking(False)
        self._accepting = False
        self._accept(True)
        self.pool = LevelledThreadPool(self._threads, _level_of)
        self._gate: PollerAdmission | None = None
        if self._early is not None and not self._inline:
            self._gate = PollerAdmission(
                self._early, self.pool, self._threads, self._submit, self._answer_in_poller, self.log
            )
        last_notify = 0.0
        try:
            while self.alive:
                now = time.monotonic()
                if now - last_notify >= TICK_S / 2:
                    self.notify()
                    last_notify = now
                    if self.ppid != os.getppid():
                        self.log.info("Parent changed, shutting down: %s", self)
                        break
                self._poll(self._next_timeout(now))
        finally:
            self._stop()

    def _poll(self, timeout: float) -> None:
        watched, accepted = self._accepting, False
        events = self._selector.select(timeout)
        if len(events) > 1 and self._gate is not None:
            events.sort(key=pass_order)  # wake-ups and listeners, then connections by their last request's level
        for key, _ in events:
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass
            elif isinstance(key.data, Connection):
                self._readable(key.data)
            else:
                accepted = True
                self._accept_from(key.fileobj)
        self._take_returned()
        now = time.monotonic()
        if watched and self._accepting and not accepted:
            self._balance.taken_elsewhere()
        elif not self._accepting and self.alive and self._room() and now >= self._balance.paused_until:
            self._accept(True)
        if self._gate is not None:
            self._gate.expire(now)
        self._expire(now)
        self._take_returned()

    def _room(self) -> bool:
        return len(self._connections) < self._max_connections

    def _next_timeout(self, now: float) -> float:
        timers = self._timers
        while timers and timers[0][2].deadline != timers[0][0]:
            heapq.heappop(timers)  # superseded
        timeout = max(0.0, min(TICK_S, timers[0][0] - now)) if timers else TICK_S
        if not self._accepting and self._balance.paused_until > now:
            timeout = min(timeout, self._balance.paused_until - now)  # to accept again when the pause ends
        held = self._gate.next_deadline() if self._gate is not None else None
        if held is not None:
            timeout = min(timeout, max(0.0, held - now))  # to answer or let in a held request at its wait
        return timeout

    def _arm(self, conn: Connection, deadline: float) -> None:
        conn.deadline = deadline
        heapq.heappush(self._timers, (deadline, next(self._order), conn))

    def _expire(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, _, conn = heapq.heappop(timers)
            if conn.deadline != deadline:
                continue  # superseded, or the connection is with a thread or closed
            conn.deadline = 0.0
            request = conn.reader.current
            if request is not None and not (request.complete or request.too_large or request.answered):
                request.timed_out = True  # its body, late: the app answers 408 and the connection closes
                self._dispatch(conn)
            else:
                self._close(conn)  # a head not in within the read timeout, or an idle keep-alive

    def _accept(self, on: bool) -> None:
        if on == self._accepting:
            return
        self._accepting = on
        for listener in self.sockets:
            if on:
                self._selector.register(listener, selectors.EVENT_READ, listener)
            else:
                self._selector.unregister(listener)

    def _accept_from(self, listener: Any) -> None:
        for _ in range(ACCEPT_PER_PASS):
            if not self.alive:
                return  # stopping: what waits in the kernel's queue is another worker's
            if not self._room():
                self._accept(False)  # the rest wait in the kernel's queue until a connection closes
                return
            now = time.monotonic()
            if not self._balance.my_turn(len(self._connections), now):
                self._accept(False)  # left to a less loaded worker for a moment (servers/sync/balance.py)
                return
            try:
                sock, peer = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log.warning("cannot accept a connection now: %s", exc)
                    self._balance.paused_until = now + TICK_S / 5  # out of descriptors: look again soon, not at once
                    self._accept(False)
                elif exc.errno not in (errno.ECONNABORTED, errno.EPROTO):
                    raise
                return
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock, peer, self._limits)
            self._connections[sock.fileno()] = conn
            self._balance.publish(len(self._connections))
            self._selector.register(sock, selectors.EVENT_READ, conn)
            # A silent new connection is closed at the read timeout, as a head not whole by then is.
            self._arm(conn, now + self._read_timeout)

    def _readable(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)  # the client has gone (a request cut short is never acted on)
            return
        reader = conn.reader
        idle = not reader.started and reader.current is None
        try:
            reader.feed(data)
        except ParseError as refused:
            self.log.debug("refused a request: %s", refused)
            while reader.heads and not reader.heads[-1].complete:
                reader.heads.pop()  # the request the error is in: never acted on
            if self._served.service is not None:
                self._served.service.unparsed(refused.error)  # no app sees it: counted here, as the async server does
            if reader.heads:
                # Requests read whole before it are answered first, in order, then its answer closes the connection
                # (RFC 9112 9.3.2, as the async server does); nothing more is read: the parser stopped at the error.
                conn.owed = raw_error_response(refused.error)
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(conn.sock)
                self._next(conn)
            else:
                self._send(conn, raw_error_response(refused.error), close=True)
            return
        if idle and (reader.started or reader.heads):
            self._arm(conn, time.monotonic() + self._read_timeout)  # a head: from its first byte
        self._next(conn)

    def _next(self, conn: Connection) -> None:
        """Hand `conn`'s next request to the threads once its body is in (or will not be read); else wait."""
        reader = conn.reader
        heads = reader.heads
        while heads and heads[0].answered and heads[0].complete:
            heads.popleft()  # refused from its head: its body, now in, was dropped as it came
        if not heads:
            if conn.owed is not None:  # a request the parser refused, once those read before it are answered
                self._send(conn, conn.owed, close=True)
            elif not reader.started:
                self._arm(conn, time.monotonic() + self._keepalive)
            return
        request = heads[0]
        if request.complete or request.too_large:
            self._dispatch(conn)
            return
        if request.answered:
            return  # its body is dropped as it comes, within the body's deadline
        refusal = self._gate.refusal_from_head(request) if self._gate is not None else None
        if refusal is not None:  # crowded: answered from its head, the body never waited for (nor acted on)
            request.answered = True
            request.level = self._level(conn, request)
            if not self._answer_in_poller(conn, request, refusal):
                return
        elif request.expect_continue and request.version == "1.1":  # the client waits for it before the body
            request.expect_continue = False
            if not self._send(conn, b"HTTP/1.1 100 Continue\r\n\r\n"):
                return
        if not request.clocked:  # the body's deadline runs from the head's end
            request.clocked = True
            self._arm(conn, time.monotonic() + self._read_timeout)

    def _dispatch(self, conn: Connection) -> None:
        request = conn.reader.heads.popleft()
        conn.deadline = 0.0
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        request.level = self._level(conn, request)
        if self._gate is not None and not request.timed_out:  # a late body's 408 needs no admission
            self._gate.admit(conn, request)
        else:
            self._submit(conn, request)

    def _submit(self, conn: Connection, request: Request) -> None:
        with self._lock:
            self._busy += 1
        conn.busy = True
        if self._inline:
            self._serve(request, conn)  # hands the connection back through `_returned`, as a thread does
        else:
            self.pool.submit(self._serve, request, conn)

    def _level(self, conn: Connection, request: Request) -> int:
        """The level the threads take `request` at: its `X-Priority`'s, QUICK for an invalid one (the app's 400,
        no model time). Where the app must see a request first (API keys, CORS: no admission here), level 1: a
        key's ceiling is the app's to apply, and a header no key vouches for orders nothing."""
        if self._early is None or self._admission is None:
            return 1
        value = request.header(b"x-priority")
        try:
            level = self._admission.priority(None if value is None else value.decode("latin-1"))
        except TwinserveError:
            return QUICK
        conn.level = level
        return level

    def _answer_in_poller(self, conn: Connection, request: Request, refusal: Refusal) -> bool:
        """A request refused from its head while crowded: the app's answer, from here. Whether the connection is
        still open."""
        status, headers, body = front_answer(refusal)
        keep = request.keep_alive and self.alive and self._keepalive > 0
        keep = keep and not (request.too_large or request.timed_out)
        if not self._send(conn, response_head(request.version, status, headers, keep, False) + body, close=not keep):
            return False
        if not request.answered:  # handed over whole: watched again (from the poller's loop, not from here)
            self._returned.append((conn, True))
        return True  # else refused from its head: still watched, its body dropped as it comes (`_next`)

    def _resume(self, conn: Connection) -> None:
        """Watch `conn` for its next request: one read already (pipelined) goes on at once, else it idles."""
        conn.sock.setblocking(False)
        reader = conn.reader
        if conn.owed is not None:  # the parser stopped at a broken request: the rest read before it, then its answer
            self._next(conn)
            return
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        if reader.heads:
            self._next(conn)
        else:
            self._arm(conn, time.monotonic() + (self._read_timeout if reader.started else self._keepalive))

    def _take_returned(self) -> None:
        """Watch again, or close, the connections handed back; a loop, not a recursion: serving a pipelined request
        hands its connection back here."""
        returned = self._returned
        if not returned:
            return
        while returned:
            conn, keep = returned.popleft()
            conn.busy = False
            if keep and self.alive:
                self._resume(conn)
            else:
                self._close(conn)
        if self._gate is not None:
            self._gate.release()  # a thread is free

    def _send(self, conn: Connection, data: bytes, close: bool = False) -> bool:
        """Write a small answer from the poller (a refusal, 100 Continue) without waiting: a client that does not
        take it is closed. Whether the connection is still open (never, with `close`)."""
        try:
            sent = conn.sock.send(data)
        except OSError:
            sent = 0
        if sent < len(data) or close:
            self._close(conn)
            return False
        return True

    def _close(self, conn: Connection) -> None:
        conn.deadline = 0.0
        sock = conn.sock
        if self._connections.get(sock.fileno()) is not conn:
            return
        del self._connections[sock.fileno()]
        self._balance.publish(len(self._connections))
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def _stop(self) -> None:
        """Stop accepting; close what idles; answer what was begun (read on, held, or with the threads) within the
        graceful timeout, each answer closing its connection."""
        self.alive = False
        self._accept(False)
        for listener in self.sockets:
            with contextlib.suppress(OSError):
                listener.close()
        if self._gate is not None:
            self._gate.drain()
        for conn in list(self._connections.values()):
            if not conn.busy and not conn.reader.started and not conn.reader.heads:
                self._close(conn)  # idle: nothing begun
        until = time.monotonic() + float(self.cfg.graceful_timeout)
        while time.monotonic() < until and (self._busy or self._connections):
            self.notify()
            self._poll(0.05)
        for conn in list(self._connections.values()):
            if not conn.busy:  # a thread still writing keeps its socket until the process exits
                self._close(conn)
        self.pool.shutdown(wait=False)

    # -- a request thread --------------------------------------------------------------------------------------
    def _serve(self, request: Request, conn: Connection) -> None:
        keep = False
        try:
            keep = self._respond(conn, request)
        except OSError as exc:  # the client went, or stopped taking the answer's bytes
            self.log.debug("could not answer %s: %s", request.target.decode("latin-1"), exc)
        except Exception:  # the app's own errors are its answers; this is a fault of the worker
            self.log.exception("Error handling request %s", request.target.decode("latin-1"))
        finally:
            with self._lock:
                self._busy -= 1
                self.nr += 1
                restart = self.nr >= self.max_requests and self.alive
            if restart:
                self.log.info("Autorestarting worker after current request.")
                self.alive = False
            # Back to the poller, which owns the connections: to be watched for the next request, or closed.
            self._returned.append((conn, keep and self.alive))
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    def _respond(self, conn: Connection, request: Request) -> bool:
        """Run the app for `request` and write its answer; whether the connection stays open."""
        with self._lock:  # the backlog's wait is measured from the take-ups, in order (core/admission.py)
            waiting = self.pool.counted()
            if self._admission is not None:
                self._admission.taken_up(time.monotonic(), waiting)
        # One the poller let in has waited its turn (servers/sync/admission.py): the backlog behind it is not its
        # wait; nor is it one answered without the model's.
        backlog = 0 if self._gate is not None or request.level == QUICK else waiting
        keep = request.keep_alive and not request.too_large and not request.timed_out and self._keepalive > 0
        sock = conn.sock
        sock.setblocking(True)
        sock.settimeout(self._read_timeout)  # a client that stops taking the answer's bytes: as one that stalls
        writer = ResponseWriter(sock, request, keep and self.alive)
        try:
            environ = environ_of(request, self._address, conn.peer, self._multiprocess)
            environ["wsgi.input"] = BodyInput(request)
            environ[BACKLOG_ENVIRON] = backlog
            if request.decided is not None:  # the poller decided it from its head: the app takes it as made
                environ[DECIDED] = request.decided
            result = self.wsgi(environ, writer.start_response)
            try:
                for chunk in result:
                    writer.write(chunk)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            writer.finish()
        except OSError:
            raise
        except Exception as exc:
            if not writer.started:
                with contextlib.suppress(OSError):
                    sock.sendall(raw_error_response(internal_error(exc)))
            raise
        return writer.keep_alive


def _level_of(request: Request) -> int:
    return request.level
