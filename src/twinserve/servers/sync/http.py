"""HTTP/1.1 for the sync worker, without I/O: a connection's bytes in, whole requests out, and what a WSGI app's
answer is written as.

`RequestReader` runs llhttp over a connection's bytes with the head limits the async server's protocol enforces
too (servers/http1.py `HeadReader`: 414, 431, 400 `malformed_http`). A body is read whole before a thread sees the
request (`Request.body`): a client that trickles it holds a socket in the poller, not a request thread. One past
`--max-body-bytes` is not read on (`Request.too_large`): the app refuses it 413 from its `Content-Length`, or from
the first `max + 1` bytes of a chunked one, as it does a body it reads.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote_to_bytes

from twinserve.servers.http1 import HeadReader, Limits
from twinserve.service.admission import Admitted

__all__ = ["SERVER", "Request", "RequestReader", "environ_of", "response_head"]

#: The `Server` header of every answer: the worker is twinserve's, its arbiter gunicorn's.
SERVER = "twinserve"


@dataclass(slots=True, eq=False)
class Request:
    """One request as the poller read it: the head, then the whole body (or as much as it reads of one)."""

    method: str
    target: bytes
    version: str
    #: Header names lower-cased, in order.
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool
    content_length: int | None
    chunked: bool
    expect_continue: bool
    body: bytearray = field(default_factory=bytearray)
    #: The body is whole (its last chunk, or its `Content-Length`, read).
    complete: bool = False
    #: The body is past `--max-body-bytes`: not read on, and the connection closes after the answer.
    too_large: bool = False
    #: The body was not whole within `--read-timeout-s` of the head's end (the app answers 408).
    timed_out: bool = False
    #: The priority level the threads take it at (servers/sync/worker.py).
    level: int = 1
    #: Whether the poller's deadline for its body runs.
    clocked: bool = False
    #: Answered from its head (a refusal while crowded): its body is dropped as it comes, never acted on.
    answered: bool = False
    #: Let in by the poller's admission from its head (servers/sync/admission.py): the app takes it as made.
    decided: Admitted | None = None

    def header(self, name: bytes) -> bytes | None:
        return next((value for key, value in self.headers if key == name), None)


class RequestReader(HeadReader):
    """llhttp's callbacks for one connection, its heads bounded (servers/http1.py). `feed` raises ParseError;
    requests whose head is complete come out of `heads` (their body may still be on its way: `Request.complete`) in
    order."""

    __slots__ = ("current", "heads", "upgraded")

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        #: The request whose head is in and whose body is still being read.
        self.current: Request | None = None
        self.heads: deque[Request] = deque()
        #: Whether the last request asked to switch protocols: nothing after its head is read as HTTP.
        self.upgraded = False

    def feed(self, data: bytes) -> None:
        if self.upgraded:
            return
        if super().feed(data) is not None:
            # A WebSocket handshake: the app answers it (501 here, after its Host, Origin and key checks); what
            # follows its head is another protocol's, never parsed, and the connection closes after the answer.
            self.upgraded = True
            if self.heads:
                self.heads[-1].keep_alive = False

    # -- llhttp's callbacks ------------------------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        parser, headers = self.parser, self.headers
        length: int | None = None
        chunked = expect = False
        for name, value in headers:
            if name == b"content-length":
                length = int(value)  # llhttp has checked it: digits, one value
            elif name == b"transfer-encoding":
                chunked = value.lower().strip().endswith(b"chunked")
            elif name == b"expect":
                expect = value.lower().strip() == b"100-continue"
        request = Request(
            parser.get_method().decode("latin-1"),
            self.url,
            parser.get_http_version(),
            headers,
            parser.should_keep_alive(),
            length,
            chunked,
            expect,
        )
        if length is not None and length > self.limits.max_body_bytes:
            request.too_large = True
        self.current = request
        self.heads.append(request)

    def on_body(self, body: bytes) -> None:
        request = self.current
        if request is None or request.too_large or request.answered:
            return
        request.body += body
        if len(request.body) > self.limits.max_body_bytes:  # a chunked one: the app sees max + 1 and refuses it
            del request.body[self.limits.max_body_bytes + 1 :]
            request.too_large = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        request = self.current
        if request is not None:
            request.complete = True
            self.current = None


# -- WSGI ------------------------------------------------------------------------------------------------------
def environ_of(request: Request, server: tuple[str, int], peer: Any, multiprocess: bool) -> dict[str, Any]:
    """The WSGI environ of `request` (PEP 3333), its body as `wsgi.input` (the caller's), headers as `HTTP_*`.
    A header whose name has an underscore is dropped, as gunicorn does (it would read as the one with a dash)."""
    target = request.target
    path, _, query = target.partition(b"?")
    if path.startswith((b"http://", b"https://")):  # an absolute form: its path
        path = b"/" + path.split(b"/", 3)[3] if path.count(b"/") >= 3 else b"/"
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "RAW_URI": target.decode("latin-1"),
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": f"HTTP/{request.version}",
        "SERVER_SOFTWARE": SERVER,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": multiprocess,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,
    }
    if isinstance(peer, tuple) and len(peer) >= 2:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = str(peer[0]), str(peer[1])
    for name, value in request.headers:
        if b"_" in name:
            continue
        text = value.decode("latin-1")
        if name == b"content-type":
            environ["CONTENT_TYPE"] = text
            continue
        if name == b"content-length":
            environ["CONTENT_LENGTH"] = text
            continue
        key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    if request.chunked and not request.too_large:
        environ["CONTENT_LENGTH"] = str(len(request.body))  # read whole: the app sees its length
    return environ


_dated: tuple[int, str] = (0, "")


def _date() -> str:
    """The `Date` value (RFC 9110 5.6.7: one-second resolution), formatted once a second, not once a response."""
    global _dated
    now = int(time.time())
    second, text = _dated
    if second != now:
        text = formatdate(now, usegmt=True)
        _dated = (now, text)  # one tuple, swapped whole: threads race only to format the same second twice
    return text


def response_head(
    version: str, status: str, headers: Iterable[tuple[str, str]], keep_alive: bool, chunked: bool
) -> bytes:
    """A response's head as the worker writes it: the status line, `Server`, `Date`, `Connection`, then the app's
    headers (its `Connection` is the worker's to write), `Transfer-Encoding: chunked` for a body of unknown length."""
    lines = [
        f"HTTP/{'1.0' if version == '1.0' else '1.1'} {status}\r\n",
        f"Server: {SERVER}\r\n",
        f"Date: {_date()}\r\n",
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n",
    ]
    lines.extend(f"{name}: {value}\r\n" for name, value in headers if name.lower() != "connection")
    if chunked:
        lines.append("Transfer-Encoding: chunked\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")
