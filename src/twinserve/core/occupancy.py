"""How many requests are inside one model right now, so that an unload can drain them before it closes the model.

Each admitted request `enter`s and, when its exchange closes, `leave`s. An unload first `stop`s admission (from
then on `enter` refuses, under the same lock, so no request slips in after the count was read) and then waits
until the count is zero: every request already inside finishes on the model it was admitted to.
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["Occupancy"]

#: How often an event loop looks again while it waits for a model to drain (a thread waits on a condition).
_ASYNC_POLL_S = 0.01


class Occupancy:
    """A count of requests inside a model, and whether more may enter. Thread-safe."""

    def __init__(self) -> None:
        self._inside = 0
        self._open = True
        self._changed = threading.Condition(threading.Lock())  # not re-entered: a plain lock is cheaper

    @property
    def inside(self) -> int:
        return self._inside

    @property
    def accepting(self) -> bool:
        """Whether requests may still enter (False once `stop`ped)."""
        return self._open

    def enter(self) -> bool:
        """Count one more request in; False (and nothing counted) once the model stopped taking requests."""
        with self._changed:
            if not self._open:
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        with self._changed:
            self._inside -= 1
            if self._inside == 0:
                self._changed.notify_all()

    def stop(self) -> None:
        """Refuse every later `enter`."""
        with self._changed:
            self._open = False

    def wait_empty(self, timeout: float) -> bool:
        """Block until no request is inside (True) or `timeout` seconds pass (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._inside == 0, timeout)

    async def await_empty(self, timeout: float) -> bool:
        """`wait_empty` for an event loop: the requests inside run on this loop, so it must not block."""
        deadline = time.monotonic() + timeout
        while self._inside and time.monotonic() < deadline:
            await asyncio.sleep(_ASYNC_POLL_S)
        return self._inside == 0
