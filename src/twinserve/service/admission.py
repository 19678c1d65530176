"""Admission, decided once per request from its head, before a byte of its body is read: `admit`.

Every front reaches it through its exchange (`Exchange.admit`); the sync worker's poller may call it first, under a
crowd, instead of the app (fronts/early.py), and hand its `Admitted` to the app, which takes it as made. In order:
the level, the sync backlog's shedding, the model the route names, the media type, the declared size and codings,
readiness, the batch queue's room, the rate limit, the deadline. The checks that depend on load or charge a token
come last, so a request any check refuses takes no rate-limit token. The rules are core's (`Admission`, the queue).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from twinserve.errors import ModelNotReady, PayloadTooLarge, UnsupportedMediaType
from twinserve.observability.tracing import Headers
from twinserve.protocol.v2 import BINARY
from twinserve.service.compression import request_codings
from twinserve.service.reply import NOT_READY_HEADERS
from twinserve.service.routes import JSON, JSON_MEDIA_TYPE

if TYPE_CHECKING:
    from twinserve.core.admission import Admission
    from twinserve.core.runtime import ModelRuntime

__all__ = ["Admitted", "Leveled", "RequestHead", "Router", "admit", "admit_socket", "head_level"]

#: V2 bodies may also be a JSON header followed by binary tensor data.
_V2_TYPE = re.compile(r"^application/(?:(?:[\w.+-]+\+)?json|octet-stream)$")
#: What `curl -d` sends (TF-Serving's own examples use it): read as JSON when it parses (from a page on another
#: site it is refused first: `Service.check_site`).
_FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class Admitted:
    """What admission decided for a request: its level, the model (and shadow) that serve it, its deadline on the
    monotonic clock (None: none), whether its body came under a form type (JSON if it parses, else 415), and the
    content codings to undo."""

    priority: int
    runtime: ModelRuntime
    shadow: ModelRuntime | None = None
    deadline: float | None = None
    lenient: bool = False
    codings: tuple[str, ...] = ()


@dataclass(slots=True)
class RequestHead:
    """What admission reads from a request's head, built once by its front from the front's own headers (ASGI's
    dict, Flask's `request`, gRPC's metadata, a WebSocket's handshake): the endpoint and the model (version) the
    path names, the body's declared type, length and codings, the `X-Request-Timeout-Ms` and `X-Priority`
    headers, V2's `Inference-Header-Content-Length`, the headers a traffic split draws its sticky key from, and
    the sync front's backlog (the requests waiting for a thread behind it; None elsewhere), and what the sync
    poller admitted it as, where it decided before the app."""

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
    decided: Admitted | None = None


class Router(Protocol):
    """What `admit` asks of the service: its rules, its body limit, and the runtime a head's route names."""

    @property
    def admission(self) -> Admission: ...

    max_body_bytes: int

    def too_large(self) -> PayloadTooLarge: ...

    def route(
        self, endpoint: str, model: str, version: str | None = None, headers: Headers | None = None
    ) -> tuple[ModelRuntime, ModelRuntime | None]: ...

    def runtime(self, model: str, version: str | None = None) -> ModelRuntime: ...


class Leveled(Protocol):
    """Where `admit` writes the request's level as soon as it is known (a request's context), so that a refusal
    is counted at it."""

    priority: int


def head_level(admission: Admission, head: RequestHead, key_id: str | None, runtime: ModelRuntime | None) -> int:
    """The request's priority level from its head: its `X-Priority` (400 out of range; no higher than its API
    key's); else its key's level; else, once its model is known (`runtime`), the model's default; else the
    server's `--default-priority`."""
    default = runtime.config.default_priority if runtime is not None and head.priority is None else None
    return admission.priority(head.priority, key_id=key_id, default=default)


def admit(
    service: Router,
    head: RequestHead,
    key_id: str | None,
    level: Leveled,
    spent: float = 0.0,
    deadline: float | None = None,
) -> Admitted:
    """Admit the request `head` describes, or raise its refusal (see the module). `spent`: seconds the sync poller
    held it unread already; `deadline`: one set while it waited for its model to load, which stands."""
    admission = service.admission
    level.priority = admission.priority(head.priority, key_id=key_id)  # `head_level` before the model is known
    if head.backlog is not None:
        admission.shed(head.backlog, level.priority, spent)
    runtime, shadow = service.route(head.endpoint, head.model, head.version, head.headers)
    if head.priority is None and runtime.config.default_priority != admission.config.default_priority:
        level.priority = head_level(admission, head, key_id, runtime)  # shedding knew no model yet
    media_type = head.content_type.split(";", 1)[0].strip().lower() if head.content_type else ""
    if media_type not in ("", _FORM_TYPE) and not (_V2_TYPE if head.endpoint == "infer" else JSON_MEDIA_TYPE).match(
        media_type
    ):
        expected = f"{JSON} or {BINARY}" if head.endpoint == "infer" else JSON
        raise UnsupportedMediaType(f"Content-Type must be {expected}, got {media_type!r}")
    if head.content_length is not None and head.content_length > service.max_body_bytes:
        raise service.too_large()
    codings = request_codings(head.content_encoding)  # 415 for a coding twinserve cannot undo
    if not runtime.ready:
        raise ModelNotReady(f"model {runtime.name!r} is still loading", headers=dict(NOT_READY_HEADERS))
    if head.endpoint != "stream":  # streams are stepped one by one, not batched
        runtime.refuse_early(level.priority)  # the queue's own refusal at `put`, decided before the body is read
    admission.rate()
    if deadline is None:
        deadline = admission.deadline(head.timeout, runtime.config.timeout_ms)
    return Admitted(level.priority, runtime, shadow, deadline, media_type == _FORM_TYPE, codings)


def admit_socket(service: Router, model: str) -> ModelRuntime:
    """Admission for a WebSocket handshake: the model exists and is ready (each message is admitted on its own)."""
    runtime = service.runtime(model)
    if not runtime.ready:
        raise ModelNotReady(f"model {runtime.name!r} is still loading", headers=dict(NOT_READY_HEADERS))
    return runtime
