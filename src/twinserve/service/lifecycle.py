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
exchange already closed. The fronts (fronts/) drive it, each with its own I/O; they build one `RequestHead` per
request (per socket, for WebSocket messages) from their own header representation, and admission reads nothing
else. `admit_head` is the part of admission that reads the head alone (the request's level, the sync backlog,
the model the head names): the exchange's `admit` and the refusal before the app (fronts/early.py) both call it.
Where the server has decided from the head already (under a crowd, before the app), it hands the app its `Decided`
(`RequestHead.decided`, published as `DECIDED`) and the exchange takes it as made: a request is admitted once.
`BodyRule` is the one set of decisions about a body's bytes (too large, cut short, too late) that the fronts apply
to what they read.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from twinserve.errors import ClientError, PayloadTooLarge, RequestTimeout
from twinserve.observability.tracing import Headers

if TYPE_CHECKING:
    from twinserve.core.admission import Admission
    from twinserve.core.runtime import ModelRuntime

__all__ = [
    "DECIDED",
    "MOVES",
    "BodyRule",
    "Decided",
    "HeadRouter",
    "IllegalTransition",
    "Leveled",
    "RequestHead",
    "Stage",
    "admit_head",
    "head_level",
]


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


#: Where a server publishes its `Decided` to the app: the ASGI scope's `extensions` key, the WSGI environ's key.
DECIDED = "twinserve.decided"


@dataclass(frozen=True, slots=True)
class Decided:
    """What admission decided from a request's head before the app saw it (fronts/early.py, asked by the HTTP
    server under a crowd): the request's level, and the model (and shadow) its route named, whose batch queue took
    it then. The exchange that is handed it does not decide them again (`Exchange.admit`): the sync poller's
    decision may be a thread's wait old by then, and deciding twice gave a request two verdicts on one head. What
    the server does not decide (the rate limit, the media type, the declared size, readiness) the exchange still
    does, and the batch queue, which decides at `put`, is asked again before the body is read."""

    priority: int
    runtime: ModelRuntime
    shadow: ModelRuntime | None = None


@dataclass(slots=True)
class RequestHead:
    """What admission reads from a request's head, built once by its front from the front's own headers (ASGI's
    dict, Flask's `request`, gRPC's metadata, a WebSocket's handshake): the endpoint and the model (version) the
    path names, the body's declared type, length and codings, the `X-Request-Timeout-Ms` and `X-Priority`
    headers, V2's `Inference-Header-Content-Length`, the headers a traffic split draws its sticky key from, and
    the sync front's backlog (the requests waiting for a thread behind it; None elsewhere), and the server's
    `Decided`, where it decided before the app."""

    endpoint: str
    model: str
    version: str | None = None
    content_type: str | None = None
    content_length: int | None = None
    content_encoding: str | None = None
    timeout: str | None = None
    priority: str | None = None
    header_length: str | None = None
    headers: Headers | None = None
    backlog: int | None = None
    decided: Decided | None = None


class HeadRouter(Protocol):
    """What `admit_head` asks of the service: its admission rules, and the runtime a head's route names."""

    @property
    def admission(self) -> Admission: ...

    def route(
        self, endpoint: str, model: str, version: str | None = None, headers: Headers | None = None
    ) -> tuple[ModelRuntime, ModelRuntime | None]: ...


class Leveled(Protocol):
    """Where `admit_head` writes the request's level as soon as it is known (a request's context)."""

    priority: int


def head_level(admission: Admission, head: RequestHead, key_id: str | None, runtime: ModelRuntime | None) -> int:
    """The request's priority level from its head: its `X-Priority` (400 out of range; no higher than its API
    key's); else its key's level; else, once its model is known (`runtime`), the model's default; else the
    server's `--default-priority`."""
    default = runtime.config.default_priority if runtime is not None and head.priority is None else None
    return admission.priority(head.priority, key_id=key_id, default=default)


def admit_head(
    service: HeadRouter, head: RequestHead, key_id: str | None, level: Leveled, spent: float = 0.0
) -> tuple[ModelRuntime, ModelRuntime | None]:
    """What admission decides from the head before anything is charged: the request's level (written to `level`
    at once, so that a refusal is counted at it), the sync backlog's shedding (`head.backlog`; `spent`: seconds the
    server held the request unread already), the model and version its route names (404; a traffic split draws
    the version, with its shadow), then the model's own default level. Returns `service.route`'s (runtime,
    shadow); raises the refusal. The exchange goes on to the rate limit, the media type, the declared size,
    readiness and the batch queue (`Exchange.admit`); the refusal before the app asks the batch queue alone."""
    admission = service.admission
    level.priority = admission.priority(head.priority, key_id=key_id)  # `head_level` before the model is known
    if head.backlog is not None:
        admission.shed(head.backlog, level.priority, spent)  # before the rate limit: a shed request takes no token
    routed = service.route(head.endpoint, head.model, head.version, head.headers)
    if head.priority is None and routed[0].config.default_priority != admission.config.default_priority:
        # Shedding (above) knew no model yet; the request's level is its model's default from here on.
        level.priority = head_level(admission, head, key_id, routed[0])
    return routed


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
