"""The arbiter's side of a worker's exit: its live gauges leave the aggregate, and a death is counted.

gunicorn before 24 calls `child_exit` from its SIGCHLD handler, so the hook can run in the middle of anything the
arbiter's main thread does, its own previous call included: two workers stopping together interrupted the first
one's import of prometheus-client with a second one (CI on gunicorn 23.0: `ImportError ... partially initialized
module`), and prometheus-client's value lock is not reentrant either. A call that finds another in progress below
it only queues its exit (`SimpleQueue.put` is documented as reentrant), and the call below takes it before it
returns. From gunicorn 24 on the hook runs in the main loop and nothing is ever queued for long.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

__all__ = ["WorkerExits"]


class WorkerExits:
    """Records each exited worker once, in the order they exited, and never inside another record."""

    def __init__(self, on_death: Callable[[int], object], on_stop: Callable[[int], object]) -> None:
        self._on_death = on_death
        self._on_stop = on_stop
        self._pending: queue.SimpleQueue[tuple[int, bool]] = queue.SimpleQueue()
        self._recording = False

    def exited(self, pid: int, died: bool) -> None:
        """Worker `pid` exited: `died` if the server did not stop it (killed, crashed, timed out)."""
        self._pending.put((pid, died))
        # Checked again after each round: an exit queued by a handler that ran just as a round ended is not left.
        while not self._recording and not self._pending.empty():
            self._recording = True
            try:
                self._record_pending()
            finally:
                self._recording = False

    def _record_pending(self) -> None:
        while True:
            try:
                pid, died = self._pending.get_nowait()
            except queue.Empty:
                return
            (self._on_death if died else self._on_stop)(pid)
