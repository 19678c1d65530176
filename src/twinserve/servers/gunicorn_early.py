"""What gthread's poller reads and writes for the sync architecture's admission (gunicorn_poller.py): a request
found whole in a socket's unread bytes, the answer to one refused, and the connections held unread.

gthread hands every readable connection to a request thread, and gunicorn parses the request there, in Python.
Refused in that thread (fronts/early.py `refuse_environ`), a request still pays the thread pool's hand-off, the
parse and the WSGI call: about what serving a small model costs, so under a flood the threads spend the CPU on
refusals that serving would have used, and a refusal waits behind the very backlog it is refused for. The poller
instead looks at the bytes first (`peek_request`, `MSG_PEEK`: nothing is taken from the socket), and only a
request it then answers is taken, exactly its bytes; anything else goes to a thread with its bytes all there.

Only what the thread would decide the same way, from the same bytes: the request's head and body are both in the
socket (`Content-Length`, not chunked), its request line and header fields within gunicorn's limits, its line
ends CRLF, llhttp (httptools) parses it. The answer is rendered as gunicorn's `Response` writes the thread's
(`render`: `Server`, `Date`, `Connection`, then the front's headers, `front_answer`).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Literal

import httptools
from gunicorn import SERVER
from gunicorn.util import http_date
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.utils import get_content_type

from twinserve.fronts.early import Refusal
from twinserve.fronts.routes import REQUEST_ID_HEADER

__all__ = ["CLOSED", "PEEK_BYTES", "Peeked", "front_answer", "peek_request", "render"]

#: How much of the socket the poller looks at: a refused request must be whole within it.
PEEK_BYTES = 65536
#: What `peek_request` finds in a socket whose client has gone (its end of file, nothing before it).
CLOSED: Literal["closed"] = "closed"


@dataclass(frozen=True, slots=True)
class Peeked:
    """A whole request found at the start of a socket's unread bytes."""

    method: bytes
    url: bytes
    #: Header names lower-cased, in order.
    headers: list[tuple[bytes, bytes]]
    #: "1.1" or "1.0": the answer's status line repeats it, as gunicorn's does.
    version: str
    #: Whether the request lets the connection stay open, by gunicorn's rule (`Request.should_close`).
    keep_alive: bool
    #: The request's bytes, head and body: what to take from the socket once it is answered.
    size: int


class _Collected:
    """httptools' callbacks, collecting the first request's head and body."""

    __slots__ = ("body", "complete", "headers", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = 0

    def on_url(self, url: bytes) -> None:
        if not self.complete:
            self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete += 1


def closed_by_client(sock: socket.socket) -> bool:
    """Whether the client has closed `sock` with nothing unread (one byte peeked, not taken)."""
    return _first_byte(sock) == b""


def has_bytes(sock: socket.socket) -> bool:
    """Whether `sock` has bytes to read, or its client has closed it (one byte peeked, not taken)."""
    return _first_byte(sock) is not None


def _first_byte(sock: socket.socket) -> bytes | None:
    """`sock`'s next unread byte, not taken (b"": closed by its client); None where there is none to read yet, on a
    reset, or for TLS (no flags): a thread finds out."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, ValueError):
        return None


def peek_request(sock: socket.socket, cfg: Any) -> Peeked | Literal["closed"] | None:
    """The whole `POST` request at the start of `sock`'s unread bytes, read without taking them; `CLOSED` when the
    client has closed the connection with nothing unread; None where there is no whole request, or where it is not
    plainly framed within gunicorn's limits (`cfg`: gunicorn's config)."""
    try:
        data = sock.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, ValueError):  # ValueError: a TLS socket takes no flags, and its bytes are not the request's
        return None
    if not data:
        return CLOSED
    if not data.startswith(b"POST /"):
        return None  # the common case when crowded is a predict request; anything else is the thread's
    end = data.find(b"\r\n\r\n")
    line_end = data.find(b"\r\n")
    if end < 0 or (cfg.limit_request_line and line_end > cfg.limit_request_line):
        return None
    head_size = end + 4
    if data.count(b"\n", 0, head_size) != data.count(b"\r\n", 0, head_size):
        return None  # a bare LF: where the head ends is the parser's call, so the thread's
    collected = _Collected()
    parser = httptools.HttpRequestParser(collected)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError:  # malformed, or an upgrade: the thread answers as gunicorn would
        return None
    headers = collected.headers
    if not collected.complete or any(name == b"transfer-encoding" for name, _ in headers):
        return None
    if cfg.limit_request_fields and len(headers) > cfg.limit_request_fields:
        return None
    if cfg.limit_request_field_size and any(len(n) + len(v) + 2 > cfg.limit_request_field_size for n, v in headers):
        return None
    body = b"".join(collected.body)
    size = head_size + len(body)
    if data[head_size:size] != body:
        return None  # the parser's framing is not the one read here: leave it to the thread
    version = parser.get_http_version()
    return Peeked(parser.get_method(), collected.url, headers, version, _keep_alive(headers, version), size)


def _keep_alive(headers: list[tuple[bytes, bytes]], version: str) -> bool:
    """gunicorn's `Request.should_close`, negated: the first `Connection` header decides, else the version."""
    for name, value in headers:
        if name == b"connection":
            token = value.lower().strip(b" \t")
            if token in (b"close", b"keep-alive"):
                return token == b"keep-alive"
            break
    return version != "1.0"


def render(version: str, status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    """The response as gunicorn's `Response` writes it for a WSGI answer with a Content-Length."""
    lines = [
        f"HTTP/{version} {status}\r\n",
        f"Server: {SERVER}\r\n",
        f"Date: {http_date()}\r\n",
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n",
        *(f"{name}: {value}\r\n" for name, value in headers),
        "\r\n",
    ]
    return "".join(lines).encode("latin-1") + body


def front_answer(refusal: Refusal) -> tuple[str, list[tuple[str, str]], bytes]:
    """The sync front's answer to a request refused before it, as the front's werkzeug `Response` writes it
    (fronts/wsgi.py: the status's upper-case phrase, the reply's headers, then content type and length, then the
    request id), without building one: under a flood this runs for every refused request."""
    reply, request_id = refusal.reply()
    headers = [
        *(reply.headers or {}).items(),
        ("Content-Type", get_content_type(reply.content_type, "utf-8")),
        ("Content-Length", str(len(reply.body))),
        (REQUEST_ID_HEADER, request_id),
    ]
    return f"{reply.status} {HTTP_STATUS_CODES[reply.status].upper()}", headers, reply.body
