"""A `Reply` written as ASGI's two messages, the head's bytes built once per shape of reply.

Every answer of the async front went through starlette's `Response`: it built a header dict, copied it into a
list of encoded pairs, looked for `content-length` and `content-type` among them and then sent. On a small model
that was about 6% of the server's CPU per request (py-spy, Echo at 64 connections). `AsgiReply` sends the same
head (the same headers, names in lower case, in the same order: the request id, the reply's own, then
`content-length` and `content-type`) with the constant parts encoded once.
"""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from twinserve.service.reply import Reply
from twinserve.service.response import header_fields

__all__ = ["AsgiReply"]


class AsgiReply:
    """`reply` to the request `request_id`, sent as `http.response.start` and one `http.response.body` (the
    `websocket.http.response.*` pair when it refuses a WebSocket handshake); its head is the one response
    writer's (service/response.py `header_fields`)."""

    __slots__ = ("reply", "request_id")

    def __init__(self, reply: Reply, request_id: str) -> None:
        self.reply, self.request_id = reply, request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        prefix = "websocket." if scope["type"] == "websocket" else ""
        reply = self.reply
        headers = header_fields(reply, self.request_id)
        await send({"type": prefix + "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": prefix + "http.response.body", "body": reply.body})
