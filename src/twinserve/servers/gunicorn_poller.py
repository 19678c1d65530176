"""Admission in gthread's poller, for the sync architecture: a crowd held in TCP, and refusals without a thread.

gthread's poller learns that a connection has bytes to read (a kept-alive connection's next request, a new
connection's first) and hands it to a request thread, which parses the request and only then can refuse it. Under
a crowd that costs the threads what serving would, and a closed-loop client refused at once comes straight back.
While the server is crowded (gthread's queue of requests waiting for a thread as long as there are threads,
a connection held, or a model's batch queue at its bound), the poller looks at the bytes first
(servers/gunicorn_early.py) and, for a whole request:

- refuses it there if its model's queue refuses it (`EarlyRefusal`): gunicorn's answer, written from the poller;
- holds the connection unread if a thread's worth of requests at its priority level or a higher one wait for
  the threads already, or one at its level or a higher one is held: its request waits in TCP, costing no CPU, one
  first-come queue per level. The threads take the highest level waiting next (servers/gunicorn_threads.py), so a
  request at a higher level than all that wait goes to them at once; the rest of the order is decided here, by
  level: a held request is released, the highest level first, then the longest held, as soon as the threads'
  queue has room for its level. Held for its level's share of `--max-queue-wait-ms` and still not next, it is refused
  (503 `queue_full`, `Retry-After`) if more requests are ahead of it than its level's count, else it is next at
  its level, behind every higher level held (for another such wait at most, then it joins the threads' queue). A
  closed-loop crowd therefore waits within that bound and is not refused and re-sent in a loop; with
  `--max-queue-wait-ms 0` nothing is held, and the backlog's count bound refuses here.

The poller itself is the crowd's bottleneck: each connection it looks at, holds or answers is system calls, and
after each it waits for the interpreter from the request threads. So while crowded one pass of the poller handles
the threads' finished requests first (a free thread, for the highest level held), then a bounded number of
connections, those whose last request was at the highest level first (within a level, the longest since its
last turn), and of held connections past their wait; the rest wait for the next pass, unread (`in_turn`), and
are not closed as idle meanwhile. Handled in arrival order, a pass took up to 400 ms over a
crowd's 200 readable connections, and a high priority waited behind all of them twice: for its request to be
seen, and for its connection to be watched again after its answer.

A request let in here (passed on, or released) is marked `admitted`: its wait is over once a thread takes it up,
so that thread does not refuse it for the backlog behind it, which only the requests behind it will wait for.
(Refused so, a crowd's requests waited their turn and were then refused: at 1,000 connections every one of
sync's refusals was made by a thread, after a second's wait.)

A connection whose client has closed it is closed here, crowded or not: it is not a request, and handed to a
thread it would count in the backlog that the requests after it are weighed against. Everything else goes to a
thread as before, its bytes untouched. A new connection accepted while crowded waits for its first bytes in the
poller (as gthread's deferred connections do) instead of in a thread. Where the app must see every request first
(API keys or CORS on: `EarlyRefusal.active`), the poller neither refuses nor holds.
"""

from __future__ import annotations

import errno
import selectors
import time
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

from gunicorn.workers import gthread

from twinserve.core.admission import Admission
from twinserve.errors import TwinserveError
from twinserve.fronts.early import EarlyRefusal, Refusal
from twinserve.servers.gunicorn_early import (
    CLOSED,
    Peeked,
    closed_by_client,
    front_answer,
    has_bytes,
    peek_request,
    render,
)
from twinserve.servers.gunicorn_threads import QUICK, LevelledThreadPool
from twinserve.servers.holding import Holding

__all__ = ["PER_PASS", "PollerAdmission", "in_turn"]

#: While crowded, how many readable connections, and how many held ones past their wait, the poller handles in one
#: pass (`in_turn`, `PollerAdmission._expire_held`).
PER_PASS = 16

#: A pass's events, as the selector gives them: (key, mask).
Events = list[tuple[Any, int]]


class PollerAdmission(gthread.ThreadWorker):  # type: ignore[misc]
    """The poller's part of `SheddingThreadWorker` (gunicorn_workers.py), which counts `_waiting` (requests handed
    to the thread pool, not yet taken up) and publishes `_early` once the app is loaded."""

    _waiting: int
    _early: EarlyRefusal | None = None
    _held: Holding | None = None
    #: The last pass's events left for a later one (`in_turn`).
    _deferred: Sequence[tuple[Any, int]] = ()
    #: Passes taken in turn so far (`in_turn`'s stamp).
    _passes = 0

    def get_thread_pool(self) -> LevelledThreadPool:
        """gunicorn's hook for gthread's request threads: here they take the highest level waiting next."""
        return LevelledThreadPool(int(self.cfg.threads), self._level_of)

    def _level_of(self, conn: Any) -> int:
        """The level a thread takes `conn` at: its request's, as the poller saw it (crowded: the last request seen
        on the connection), else the default level."""
        level = getattr(conn, "level", None)
        if level is None:
            level = self._admission().priority(None) if self._early is not None else 1
        return int(level)

    def _has_room(self, level: int) -> bool:
        """Whether a request at `level` handed to the threads now is within a thread's worth of the next to be
        taken up: the requests waiting at its level or a higher one are fewer than the threads."""
        return bool(self.tpool.ahead_of(level) < self._short)

    def _admission(self) -> Admission:
        assert self._early is not None
        return self._early.service.admission

    def _crowded(self) -> bool:
        early = self._early
        if early is None:
            return False
        return self._waiting >= self._short or bool(self._held) or early.crowded(self._waiting)

    @property
    def _short(self) -> int:
        """How many requests at a level or above may wait for a thread, while the poller holds the rest in TCP:
        one per thread, so a thread that finishes finds the next request there while the poller wakes up to
        release another, and a request at that level waits for no more than a thread's worth of others."""
        return int(self.cfg.threads)

    def accept(self, listener: Any) -> None:
        """gthread accepts one connection per pass of its poller. While crowded, a pass takes up to `PER_PASS`
        of those waiting: a client that opens connections as it needs them (a pool growing under load) had a new
        one wait behind a crowd's hundreds in the kernel's queue, one a pass, seconds for a high priority's.
        Each waits for its first bytes in the poller, not in a thread."""
        if not self._crowded():
            super().accept(listener)
            return
        for _ in range(PER_PASS):
            try:
                client, address = listener.accept()
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                    raise
                return
            self.nr_conns += 1
            conn = gthread.TConn(self.cfg, client, address, listener.getsockname())  # non-blocking
            conn.timeout = time.monotonic() + self.cfg.keepalive
            self.pending_conns.append(conn)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))
            if self.nr_conns >= self.worker_connections:
                return  # gthread stops watching the listener at its limit

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        if not self._taken_in_poller(conn, self.keepalived_conns):
            super().on_client_socket_readable(conn, client)

    def on_pending_socket_readable(self, conn: Any, client: Any) -> None:
        if not self._taken_in_poller(conn, self.pending_conns):
            super().on_pending_socket_readable(conn, client)

    def _taken_in_poller(self, conn: Any, waiting: deque[Any]) -> bool:
        """Refuse or hold the request of a connection waiting in the poller (`waiting`: the deque it is in);
        whether it was. Otherwise a thread takes it, as in gthread."""
        if not self._crowded():
            if self._early is None or not self.tpool.waits():  # a thread takes it at once: its level decides nothing
                closed = closed_by_client(conn.sock)
            else:  # it waits for a thread, and a request at a higher level may go ahead of it: learn its level
                peeked = peek_request(conn.sock, self.cfg)
                closed = peeked == CLOSED
                if isinstance(peeked, Peeked):
                    self._learn_level(conn, peeked)
            if closed:
                # Not a request: handed to a thread it would count in the backlog until one took it up, and a
                # request arriving meanwhile would be weighed against it (one peek, a system call, per request).
                self._drop(conn, waiting)
                return True
            conn.admitted = self._early is not None  # the common case, a few counter reads: under every bound
            return False
        early, backlog = self._early, self._waiting  # read without the lock: the threads' own refusal does too
        assert early is not None
        peeked = peek_request(conn.sock, self.cfg)
        if peeked is None:
            return False
        if peeked == CLOSED:  # a thread would only learn that: it is not a request, so it joins no backlog
            self._drop(conn, waiting)
            return True
        # Holding (--max-queue-wait-ms > 0): the backlog holds a request, so only its model's queue refuses here.
        holding = bool(self._admission().backlog.max_wait)
        refusal = early.refusal(peeked.method, peeked.url, peeked.headers, None if holding else backlog)
        if refusal is None and holding:
            level = self._held_level(conn, peeked)
            if level is not None:
                assert self._held is not None
                waiting.remove(conn)
                self.poller.unregister(conn.sock)
                conn.peeked = peeked  # what its expiry answers: nothing is read from a held connection
                self._held.add(conn, level, time.monotonic() + self._admission().backlog.wait_for(level))
                self.log.debug("held a request at priority %d for a thread (%d held)", level, len(self._held))
                return True
        if refusal is None:
            conn.admitted = True  # decided here: its thread does not weigh the backlog behind it
            return False
        self._answer(conn, waiting, peeked, refusal)
        return True

    def _drop(self, conn: Any, waiting: deque[Any]) -> None:
        """Close a connection its client has closed, from the poller's `waiting` deque."""
        waiting.remove(conn)
        self.poller.unregister(conn.sock)
        self._close(conn)

    def _held_level(self, conn: Any, peeked: Peeked) -> int | None:
        """The priority level to hold an inference request at, if the threads' queue is full for its level or a
        request at its level or above is held already (it waits its turn); else None."""
        level = self._learn_level(conn, peeked)
        if level is None:
            return None
        if self._held is None:
            self._held = Holding(self._admission().backlog.levels)
        if self._has_room(level) and not self._held.holds_up_to(level):
            jumped = len(self.tpool) - self.tpool.ahead_of(level)
            if jumped:
                said = "a request at priority %d goes to the threads ahead of %d at lower levels"
                self.log.debug(said, level, jumped)
            return None
        return level

    def _learn_level(self, conn: Any, peeked: Peeked) -> int | None:
        """The priority level of an inference request, kept as its connection's `level` (a client's next request
        on a connection is nearly always at the same level); None for any other request, or an invalid
        `X-Priority`, which the threads take first, at no level (gunicorn_threads.py `QUICK`: the app's 400)."""
        if self._early is None or not EarlyRefusal.inference(peeked.method, peeked.url):
            return None
        value = next((v for name, v in peeked.headers if name == b"x-priority"), None)
        try:
            conn.level = self._admission().priority(None if value is None else value.decode("latin-1"))
        except TwinserveError:
            conn.level = QUICK
            return None
        return int(conn.level)

    def _answer(self, conn: Any, waiting: deque[Any] | None, peeked: Peeked, refusal: Refusal) -> None:
        """Write the refusal of `peeked`, taking exactly its bytes from the socket; then keep the connection alive
        in the poller as after any answer, or close it. `waiting`: the poller's deque the connection is in (None:
        a held one, out of the poller)."""
        # gunicorn's handle_request closes instead while stopping, without keep-alive, or with too many kept.
        keep = peeked.keep_alive and self.alive and bool(self.cfg.keepalive)
        keep = keep and len(self.keepalived_conns) < self.max_keepalived + (waiting is self.keepalived_conns)
        status, headers, body = front_answer(refusal)
        answer = render(peeked.version, status, headers, body, keep)
        try:
            taken = len(conn.sock.recv(peeked.size))  # exactly the refused request: the next one stays unread
            sent = conn.sock.send(answer)  # never blocks the poller: a client that does not read is closed
        except OSError:
            taken = sent = 0
        if waiting is not None:
            waiting.remove(conn)
        if keep and taken == peeked.size and sent == len(answer):
            conn.set_timeout()  # kept alive: at the end of the deque, which stays sorted by timeout
            self.keepalived_conns.append(conn)
            callback = partial(self.on_client_socket_readable, conn)
            if waiting is None:
                self.poller.register(conn.sock, selectors.EVENT_READ, callback)
            else:
                self.poller.modify(conn.sock, selectors.EVENT_READ, callback)
            return
        if waiting is not None:
            self.poller.unregister(conn.sock)
        self._close(conn)

    def _close(self, conn: Any) -> None:
        self.nr_conns -= 1
        conn.close()

    def _release_held(self) -> None:
        """Hand held connections to the threads while their queue has room, the highest level first."""
        held = self._held
        if not held:
            return
        if not self.alive:  # stopping: the threads answer each with Connection: close
            for conn in held.drain():
                self.enqueue_req(conn)
            return
        while (conn := held.release(self._has_room)) is not None:
            conn.admitted = True
            self.enqueue_req(conn)

    def _expire_held(self) -> None:
        """Refuse (or let in) connections held past their wait, at most `PER_PASS` in one pass: each is system
        calls, and a crowd's connections expire by the hundred while a thread's finished request and a high
        priority's next one wait for the poller (`in_turn`). The rest are next, the poller not waiting. One let in
        that higher levels kept from a thread for another wait of its level goes to the threads' queue anyway."""
        held = self._held
        if held:
            now = time.monotonic()
            for conn in held.overdue(now, PER_PASS):
                conn.admitted = True
                self.enqueue_req(conn)
            for conn, level in held.expired(now, PER_PASS):
                self._expired(conn, level)

    def _expired(self, conn: Any, level: int) -> None:
        """A connection held for its whole wait: refused if more requests are ahead of it (waiting for a thread,
        held at higher levels, let in before it at its own) than its level's count, else let in; its wait is spent,
        so no more may be added. Let in, it goes to the threads now if their queue has room and no higher level is
        held, else it is next at its level (`Holding.admit`): handed over past their queue's length it would go
        ahead of the higher levels held, in their first-come queue."""
        early, held = self._early, self._held
        assert early is not None and held is not None
        peeked, conn.peeked = conn.peeked, None  # a client that closed meanwhile is closed after the answer
        wait = self._admission().backlog.wait_for(level)
        ahead = self.tpool.ahead_of(level) + held.ahead_of(level)
        refusal = early.refusal(peeked.method, peeked.url, peeked.headers, ahead, wait)
        if refusal is not None:
            self._answer(conn, None, peeked, refusal)
        elif not self._has_room(level) or held.holds_up_to(level - 1):
            held.admit(conn, level, time.monotonic() + wait)
            self.log.debug("let in a request held at priority %d at its wait, behind higher levels", level)
        else:
            conn.admitted = True
            self.enqueue_req(conn)

    def finish_request(self, conn: Any, fs: Any) -> None:
        super().finish_request(conn, fs)
        self._release_held()  # a thread is free
        self._next_now(conn)

    def _next_now(self, conn: Any) -> None:
        """While lower levels are held and its own is not, take a kept-alive connection's next request now if it
        is in already and its level would go to a thread at once, instead of on the poller's next pass: a
        closed-loop client sends it as soon as it has its answer, which is before the poller learns the thread is
        done, and a pass while crowded is up to `PER_PASS` connections of system calls long. A high priority beside
        a low crowd so saves a pass a request. Not among connections at one level: one taken now would go ahead of
        its peers already readable, first come no longer first served (at 16 connections, P99 +15-50%)."""
        held, level = self._held, self._level_of(conn)
        if not held or held.holds_up_to(level) or not self._has_room(level):
            return
        try:
            key = self.poller.get_key(conn.sock)
        except (KeyError, ValueError):  # closed, or not kept alive
            return
        if key.data.func == self.on_client_socket_readable and has_bytes(conn.sock):
            self.on_client_socket_readable(conn, conn.sock)

    def murder_keepalived(self, force: bool = False) -> None:
        deferred, self._deferred = self._deferred, ()
        if deferred and not force:
            # A connection left for a later pass has a request unread: its keep-alive (or first-byte) timeout is
            # for idle ones, and closing it would lose the request and reset the connection. Its turn is now.
            now = time.monotonic()
            for event in deferred:
                conn = _connection(event)
                if conn is not None and conn.timeout is not None and conn.timeout <= now:
                    event[0].data(event[0].fileobj)
        super().murder_keepalived(force)
        self._release_held()  # after every wake-up of the poller
        self._expire_held()

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        deadline = self._held.next_deadline() if self._held else None
        if deadline is not None:  # wake up for the first held connection's deadline
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        try:
            events = self.poller.select(timeout)
        except OSError as exc:
            if exc.errno != errno.EINTR:
                raise
            return
        if len(events) > 1 and self._early is not None:  # crowded, or about to be within this pass
            self._passes += 1
            events, self._deferred = in_turn(events, self._admission().priority(None), self._passes)
        for key, _ in events:
            key.data(key.fileobj)


def in_turn(events: Events, default: int, turn: int) -> tuple[Events, Events]:
    """The poller's events of one pass in turn, and those left for a later pass (their connections stay readable).
    This pass: the threads' finished requests (the method queue: a thread is free, and a held request can go to
    it) and the listeners, then at most `PER_PASS` connections, by the level of the last request each sent
    (`default` for one not seen yet), the highest first, and within a level the longest since its last turn first;
    each taken is stamped with `turn`, this pass's number (see the module's docstring).

    Not epoll's order within a level: a level-triggered descriptor keeps its place in the ready list, so a
    closed-loop client answered in one pass is ready again at the head of the next, and the same few connections
    would take every turn while the rest waited out their keep-alive."""
    ranked = sorted(events, key=partial(_rank, default=default))
    now = sum(1 for event in ranked if _connection(event) is None) + PER_PASS
    for event in ranked[:now]:
        conn = _connection(event)
        if conn is not None:
            conn.turn = turn
    return ranked[:now], ranked[now:]


def _connection(event: tuple[Any, int]) -> Any | None:
    """The connection an event is for; None for the method queue and the listeners."""
    data = event[0].data
    return data.args[0] if isinstance(data, partial) and data.args else None


def _rank(event: tuple[Any, int], default: int) -> tuple[int, int]:
    """(0, 0) for the method queue and the listeners, else the level of the connection's last request seen and the
    pass that last took it."""
    conn = _connection(event)
    return (0, 0) if conn is None else (getattr(conn, "level", default), getattr(conn, "turn", 0))
