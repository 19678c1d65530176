"""The most Python HTTP can do here: a bare ASGI app that reads and parses the JSON body, answers a constant.

Any path and method get the same answer, so `GET /health` doubles as its readiness probe.
"""

from __future__ import annotations

from typing import Any

import orjson

ANSWER = b'{"predictions":[0]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if body:
        orjson.loads(body)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
