"""A complete response as every front writes it (`Reply`), and an error as one: a leaf every front and the
service share (the exchange, the control API, the V2 handlers, compression), so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from twinserve.errors import TwinserveError, error_payload, v1_error_payload
from twinserve.protocol.v1 import dumps
from twinserve.protocol.v2 import error_body
from twinserve.service.routes import JSON, ErrorShape

__all__ = ["NOT_READY_HEADERS", "Reply", "error_reply"]

#: What a not-ready answer carries (a model loading: its ready routes, its predict, the server's readiness).
NOT_READY_HEADERS: Mapping[str, str] = {"Retry-After": "1"}


@dataclass(frozen=True)
class Reply:
    """A complete response: status, JSON body bytes, extra headers."""

    status: int
    body: bytes
    headers: Mapping[str, str] | None = None
    content_type: str = JSON  # "" for a response without a body (204)


def error_reply(error: TwinserveError, request_id: str, shape: ErrorShape = "twinserve") -> Reply:
    """The error as a response, its body in `shape` (service/routes.py `ErrorShape`): twinserve's, V1's
    (TF-Serving/KServe: `error` is the message) or the Open Inference Protocol's `{"error": "message"}`."""
    if shape == "v2":
        body = error_body(error)
    elif shape == "v1":
        body = dumps(v1_error_payload(error, request_id))
    else:
        body = dumps(error_payload(error, request_id))
    return Reply(error.status, body, error.headers or None)
