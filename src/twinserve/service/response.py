"""The one response writer: a `Reply`'s head as header fields in the one order every answer carries them, and
the whole response as HTTP/1.1 bytes for the servers that write it themselves. IO-free (h11's idea: bytes out,
no socket).

Its users: the async front's reply (fronts/asgi_reply.py, as ASGI's two messages) and the head of its event
streams (fronts/sse.py), the refusal before the app (fronts/early.py, which must be the app's answer byte for byte:
it is, by construction), and the HTTP servers' answer to a head they could not parse (`raw_error_response`). The
sync front's answers are Flask's (werkzeug writes their head); servers/sync/answers.py writes a refusal before the
app as werkzeug would.

The order: the request id, the reply's own headers, then `content-length` (not on a 1xx, 204 or 304: RFC 9110
section 8.6, nor on a body streamed in parts, which the server frames) and `content-type` unless the reply set them;
names in lower case.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable
from http import HTTPStatus

from twinserve.service.reply import Reply
from twinserve.service.routes import REQUEST_ID_HEADER

__all__ = ["header_fields", "http1_response"]

_REQUEST_ID = REQUEST_ID_HEADER.lower().encode("latin-1")
_CONTENT_LENGTH, _CONTENT_TYPE = b"content-length", b"content-type"


@functools.lru_cache(maxsize=64)
def _content_type(media_type: str) -> tuple[bytes, bytes]:
    """The `content-type` field for `media_type`; a text type names its charset, as starlette's did."""
    if media_type.startswith("text/") and "charset=" not in media_type.lower():
        media_type += "; charset=utf-8"
    return _CONTENT_TYPE, media_type.encode("latin-1")


def header_fields(reply: Reply, request_id: str, streamed: bool = False) -> list[tuple[bytes, bytes]]:
    """`reply`'s header fields, to the request `request_id`, in the one order (see the module doc); `streamed`: its
    body follows in parts (`reply.body` is empty), of a length known to no one yet."""
    headers = [(_REQUEST_ID, request_id.encode("latin-1"))]
    named: Collection[bytes] = ()  # what the reply sets itself
    if reply.headers:
        headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()]
        named = {name for name, _ in headers}
    status = reply.status
    if not (streamed or status < 200 or status in (204, 304)) and _CONTENT_LENGTH not in named:
        headers.append((_CONTENT_LENGTH, str(len(reply.body)).encode("latin-1")))
    if reply.content_type and _CONTENT_TYPE not in named:
        headers.append(_content_type(reply.content_type))
    return headers


def http1_response(
    reply: Reply, request_id: str, server_headers: Iterable[tuple[bytes, bytes]] = (), close: bool = True
) -> bytes:
    """`reply` as a whole HTTP/1.1 response: its status line, the server's own fields first (`date`, `server`,
    as uvicorn writes them on every response), `header_fields`, `connection: close` when the server closes the
    connection after it, and the body."""
    lines = [f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}\r\n".encode("latin-1")]
    fields = [*server_headers, *header_fields(reply, request_id)]
    if close:
        fields.append((b"connection", b"close"))
    lines += [name + b": " + value + b"\r\n" for name, value in fields]
    lines.append(b"\r\n")
    lines.append(reply.body)
    return b"".join(lines)
