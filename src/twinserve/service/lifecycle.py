"""A request's life as states, IO-free: what its head carries, the stages it passes, the moves between them.

```
    OPEN --admit(head)--> ADMITTED --decode(body)--> DECODED --encode / reply--> ANSWERED --+
      |                      |                                                    ^   ^     | a stream:
      +----------------------+-- reply (a route with no body: health, metadata) --+   +-----+ each step
    any stage but CLOSED --fail--> FAILED    ANSWERED -> FAILED: a stream that broke, an answer never taken;
                                             FAILED -> FAILED: the later failure is the outcome
    any stage --close--> CLOSED              logged, counted, traced, released: once (closing again: nothing)
```

An exchange (service/exchange.py) holds its `Stage` and moves only along `MOVES`; any other move raises
`IllegalTransition`: a body decoded before its head was admitted, a request admitted twice, anything done to an
exchange already closed. The fronts (fronts/) drive it, each with its own I/O, and build the `RequestHead` that
admission reads (service/admission.py). `BodyRule` is the one set of decisions about a body's bytes (too
large, cut short, too late) that the fronts apply to what they read.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from twinserve.errors import ClientError, PayloadTooLarge, RequestTimeout

__all__ = ["DECIDED", "MOVES", "BodyRule", "IllegalTransition", "Stage"]


class Stage(enum.IntEnum):
    """Where a request is in its life."""

    OPEN = 0
    ADMITTED = 1
    DECODED = 2
    ANSWERED = 3
    FAILED = 4
    CLOSED = 5


#: Each stage -> the stages an exchange may move to from it. ANSWERED -> ANSWERED: a stream (gRPC's, SSE's) is
#: answered step by step; -> FAILED: one that broke after its first step, or an answer the client never took.
#: FAILED -> FAILED: a failure while sending the error (the client left) replaces it. CLOSED is the end.
MOVES: dict[Stage, frozenset[Stage]] = {
    Stage.OPEN: frozenset({Stage.ADMITTED, Stage.ANSWERED, Stage.FAILED, Stage.CLOSED}),
    Stage.ADMITTED: frozenset({Stage.DECODED, Stage.ANSWERED, Stage.FAILED, Stage.CLOSED}),
    Stage.DECODED: frozenset({Stage.ANSWERED, Stage.FAILED, Stage.CLOSED}),
    Stage.ANSWERED: frozenset({Stage.ANSWERED, Stage.FAILED, Stage.CLOSED}),
    Stage.FAILED: frozenset({Stage.FAILED, Stage.CLOSED}),
    Stage.CLOSED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A front asked an exchange for a move its stage does not allow: a bug in the front, never the client's."""

    def __init__(self, stage: Stage, to: Stage) -> None:
        super().__init__(f"an exchange cannot move from {stage.name} to {to.name}")
        self.stage, self.to = stage, to


#: The WSGI environ's key under which the sync worker hands the app what its poller admitted (service/admission.py).
DECIDED = "twinserve.decided"


class BodyRule:
    """The decisions about a request body's bytes, one per service, the same for every front: past
    `--max-body-bytes` (413), shorter than its `Content-Length` (400, the connection closed: never act on half a
    message), not arrived within `--read-timeout-s` (408, closed). The reading is the front's (awaited chunks,
    a blocking read); what it read is judged here."""

    __slots__ = ("max_bytes", "read_timeout_s", "too_large")

    def __init__(self, max_bytes: int, read_timeout_s: float, too_large: Callable[[], PayloadTooLarge]) -> None:
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s
        self.too_large = too_large

    @property
    def read_limit(self) -> int:
        """How much a front reads of a body of unknown length: one byte past the limit tells it is too large."""
        return self.max_bytes + 1

    def within(self, size: int) -> None:
        """Raise PayloadTooLarge once `size` bytes (so far, or in all) are past the limit."""
        if size > self.max_bytes:
            raise self.too_large()

    def whole(self, body: bytes, declared: int | None = None) -> bytes:
        """`body`, once it is judged complete: within the limit, and as long as the `declared` length (None:
        none declared, the read ended where the body did)."""
        if len(body) > self.max_bytes:
            raise self.too_large()
        if declared is not None and len(body) < declared:
            raise ClientError(
                f"the request body ended after {len(body)} of the {declared} bytes its Content-Length announced",
                headers={"Connection": "close"},
            )
        return body

    def late(self) -> RequestTimeout:
        """The 408 for a body that did not arrive in time (the connection closes)."""
        return RequestTimeout(
            f"the request body did not arrive within {self.read_timeout_s:g} s (--read-timeout-s)",
            headers={"Connection": "close"},
        )
