"""Admission in the sync worker's poller: a crowd held in the poller, and refusals without a thread.

A thread that takes a request only to refuse it costs about what serving a small model costs, and a closed-loop
client refused at once comes straight back. So while the worker is crowded (as many requests wait for a thread as
there are threads, a request is held, or a model's batch queue is at its bound), the poller decides first, from the
request it has read whole (servers/sync/http.py):

- it refuses the request there if its model's queue refuses it (fronts/early.py): the app's answer, from the poller;
- it holds the request if a thread's worth of requests at its priority level or a higher one wait for the threads
  already, or one at its level or a higher one is held: it waits in the poller, costing no CPU, one first-come
  queue per level (servers/sync/holding.py). The threads take the highest level waiting next
  (servers/sync/threads.py), so a request at a higher level than all that wait goes to them at once; the rest
  of the order is decided here: a held request is released, the highest level first, then the longest held, as
  soon as the threads' queue has room for its level. Held for its level's share of `--max-queue-wait-ms` and still
  not next, it is refused (503 `queue_full`, `Retry-After`) if more requests are ahead of it than its level's
  count, else it is next at its level, behind every higher level held (for another such wait at most, then it
  joins the threads' queue). A closed-loop crowd therefore waits within that bound and is not refused and re-sent
  in a loop; with `--max-queue-wait-ms 0` nothing is held, and the backlog's count bound refuses here.

A request let in here (handed over, or released) has waited its turn: the thread that takes it does not refuse it
for the backlog behind it, which only the requests behind it will wait for. What the poller decided is decided
once: the request carries its `Admitted` (service/admission.py) to the app, which takes it as made; a request whose
body is still on its way is decided from its head, once, not again as each piece of its body arrives, nor when it
is whole. A held request is decided again only at the end of its wait, with that wait counted. Where the app must
see every request first (API keys or CORS on: `EarlyRefusal.active`), the poller neither refuses nor holds, and
the app decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twinserve.core.admission import Admission
from twinserve.fronts.early import EarlyRefusal, Refusal
from twinserve.servers.sync.holding import Holding
from twinserve.servers.sync.http import Request
from twinserve.servers.sync.threads import QUICK, LevelledThreadPool

__all__ = ["PER_PASS", "PollerAdmission"]

#: How many held requests past their wait the poller answers or lets in in one pass: each is system calls, and a
#: crowd's expire by the hundred while a thread's finished request waits for the poller.
PER_PASS = 16

#: What the poller hands a request on with: (connection, request).
Submit = Callable[[Any, Request], None]
Answer = Callable[[Any, Request, Refusal], object]


class PollerAdmission:
    """The poller's decisions for one worker: `admit` each whole request, `release` and `expire` held ones."""

    def __init__(
        self, early: EarlyRefusal, pool: LevelledThreadPool, threads: int, submit: Submit, answer: Answer, log: Any
    ) -> None:
        self._early = early
        self._admission: Admission = early.service.admission
        self._pool = pool
        #: How many requests at a level or above may wait for a thread while the rest are held: one per thread, so
        #: a thread that finishes finds the next there while the poller wakes to release another.
        self._short = threads
        self._submit = submit
        self._answer = answer
        self._log = log
        self._held = Holding(self._admission.backlog.levels)

    def __len__(self) -> int:
        return len(self._held)

    def crowded(self) -> bool:
        backlog = self._pool.counted()
        return backlog >= self._short or bool(self._held) or self._early.crowded(backlog)

    def admit(self, conn: Any, request: Request) -> None:
        """Hand `request` to the threads, refuse it, or hold it (see the module)."""
        if not self.crowded():
            self._submit(conn, request)  # the common case, a few counter reads: under every bound
            return
        holding = bool(self._admission.backlog.max_wait)
        if request.decided is None:  # else decided from its head while its body came (`refusal_from_head`)
            refusal = self._decide(request, None if holding else self._pool.counted())
            if refusal is not None:
                self._answer(conn, request, refusal)
                return
        level = request.level
        inference = EarlyRefusal.inference(request.method.encode(), request.target)
        if holding and inference and level != QUICK:
            if not self._has_room(level) or self._held.holds_up_to(level):
                self._held.add((conn, request), level, time.monotonic() + self._admission.backlog.wait_for(level))
                self._log.debug("held a request at priority %d for a thread (%d held)", level, len(self._held))
                return
            jumped = len(self._pool) - self._pool.ahead_of(level)
            if jumped:
                said = "a request at priority %d goes to the threads ahead of %d at lower levels"
                self._log.debug(said, level, jumped)
        self._submit(conn, request)

    def refusal_from_head(self, request: Request) -> Refusal | None:
        """While crowded, the refusal of a request whose body is still on its way (fronts/early.py decides from
        the head alone): answered at once, it never waits for a body it would not act on. Let in, it is not asked
        about again (`Request.decided`)."""
        if request.decided is not None or not self.crowded():
            return None
        return self._decide(request, None if self._admission.backlog.max_wait else self._pool.counted())

    def _decide(self, request: Request, backlog: int | None, spent: float = 0.0) -> Refusal | None:
        """The request's refusal from its head, else None, what it admitted (if any: else the app decides) kept for
        the app."""
        verdict = self._early.verdict(request.method.encode(), request.target, request.headers, backlog, spent)
        if isinstance(verdict, Refusal):
            return verdict
        request.decided = verdict
        return None

    def _has_room(self, level: int) -> bool:
        """Whether a request at `level` handed over now is within a thread's worth of the next to be taken up."""
        return self._pool.ahead_of(level) < self._short

    def release(self) -> None:
        """Hand held requests to the threads while their queue has room, the highest level first."""
        held = self._held
        while held and (entry := held.release(self._has_room)) is not None:
            self._submit(*entry)

    def drain(self) -> None:
        """Stopping: every held request goes to the threads, which answer each with `Connection: close`."""
        for entry in self._held.drain():
            self._submit(*entry)

    def next_deadline(self) -> float | None:
        return self._held.next_deadline() if self._held else None

    def expire(self, now: float) -> None:
        """Refuse, or let in, requests held past their wait (at most `PER_PASS` of each in one pass)."""
        held = self._held
        if not held:
            return
        for entry in held.overdue(now, PER_PASS):
            self._submit(*entry)
        for (conn, request), level in held.expired(now, PER_PASS):
            self._expired(conn, request, level)

    def _expired(self, conn: Any, request: Request, level: int) -> None:
        """A request held for its whole wait: refused if more requests are ahead of it (waiting for a thread, held
        at higher levels, let in before it at its own) than its level's count, else let in; its wait is spent, so
        no more may be added. Let in, it goes to the threads now if their queue has room and no higher level is
        held, else it is next at its level (`Holding.admit`): handed over past their queue's length it would go
        ahead of the higher levels held, in their first-come queue."""
        held = self._held
        wait = self._admission.backlog.wait_for(level)
        ahead = self._pool.ahead_of(level) + held.ahead_of(level)
        refusal = self._decide(request, ahead, wait)
        if refusal is not None:
            self._answer(conn, request, refusal)
        elif not self._has_room(level) or held.holds_up_to(level - 1):
            held.admit((conn, request), level, time.monotonic() + wait)
            self._log.debug("let in a request held at priority %d at its wait, behind higher levels", level)
        else:
            self._submit(conn, request)
