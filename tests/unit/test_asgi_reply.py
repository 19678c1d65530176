"""A reply sent as two ASGI messages (fronts/asgi_reply.py) carries the head and body starlette's `Response` did."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response

from twinserve.fronts.asgi_reply import AsgiReply
from twinserve.observability.metrics import CONTENT_TYPE
from twinserve.service.reply import Reply
from twinserve.service.routes import HTML, REQUEST_ID_HEADER

REPLIES = [
    Reply(200, b'{"predictions":[1]}'),
    Reply(200, b""),  # an empty JSON body still says its length, 0
    Reply(503, b'{"error":"full"}', {"Retry-After": "1"}),
    Reply(200, b"<html></html>", content_type=HTML),
    Reply(200, b"# metrics\n", content_type=CONTENT_TYPE),
    Reply(200, b"text", content_type="text/plain"),  # a text type without a charset is given utf-8's
    Reply(204, b"", {"Allow": "GET, POST"}, content_type=""),  # RFC 9110 section 8.6: no Content-Length on a 204
    Reply(200, b"\x00\x01", {"Inference-Header-Content-Length": "2"}, content_type="application/octet-stream"),
    Reply(200, b"gz", {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}),
    Reply(200, b"{}", {"Content-Type": "application/problem+json"}),  # the reply's own type stands
    Reply(200, b"{}", {"content-length": "2"}),  # and its own length
]


def _sent(app: Any, scope_type: str = "http") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        messages.append(message)

    async def receive() -> Any:
        raise AssertionError("a reply reads nothing")

    asyncio.run(app({"type": scope_type}, receive, send))
    return messages


@pytest.mark.parametrize("reply", REPLIES, ids=[f"{r.status}-{r.content_type or 'none'}" for r in REPLIES])
@pytest.mark.parametrize("scope_type", ["http", "websocket"])  # a refused WebSocket handshake's denial response
def test_the_same_messages_as_starlettes_response(reply: Reply, scope_type: str) -> None:
    starlette = Response(
        reply.body,
        status_code=reply.status,
        headers={REQUEST_ID_HEADER: "req-1", **(reply.headers or {})},
        media_type=reply.content_type or None,
    )
    assert _sent(AsgiReply(reply, "req-1"), scope_type) == _sent(starlette, scope_type)
