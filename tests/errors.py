"""twinserve's error fields read from either body shape (docs/http-contract.md "Error bodies"): V1 routes' flat
`{"error": "message", "code", "request_id"}` (the string TF-Serving and KServe clients read) or the nested
`{"error": {"code", "message", "request_id"}}` of every other twinserve route, SSE error events and WebSocket
frames. Tests that assert a code or message read it through here, whatever the route."""

from __future__ import annotations

from typing import Any

__all__ = ["error_fields", "without_request_id"]


def error_fields(body: Any) -> dict[str, Any]:
    """`{"code", "message", "request_id"[, "details"]}` of an error body of either shape."""
    error = body["error"]
    if isinstance(error, str):
        return {"message": error, **{k: v for k, v in body.items() if k != "error"}}
    return dict(error)


def without_request_id(body: Any) -> Any:
    """An error body (either shape) less its request id, the one part that differs between architectures."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            error.pop("request_id", None)
        elif isinstance(error, str):
            body.pop("request_id", None)
    return body
