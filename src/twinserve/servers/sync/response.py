"""A WSGI app's answer written to its connection by the request thread that ran it."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from twinserve.servers.sync.http import Request, response_head

__all__ = ["ResponseWriter"]


class ResponseWriter:
    """WSGI's `start_response` and `write` for one request (PEP 3333): the head goes out with the first body bytes;
    a body of unknown length is chunked (HTTP/1.1) or ends with the connection (HTTP/1.0); bytes past a declared
    `Content-Length` are not sent (they would be read as the next answer)."""

    __slots__ = ("_chunked", "_head", "_left", "_no_body", "_sock", "keep_alive", "request", "started")

    def __init__(self, sock: socket.socket, request: Request, keep_alive: bool) -> None:
        self._sock = sock
        self.request = request
        self.keep_alive = keep_alive
        self._head: bytes | None = None
        self._chunked = False
        self._left: int | None = None  # body bytes the declared Content-Length still allows
        self._no_body = False
        self.started = False

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        if exc_info is not None:
            if self.started:
                raise exc_info[1].with_traceback(exc_info[2])
        elif self._head is not None:
            raise AssertionError("start_response() called twice without exc_info")
        code = int(status[:3])
        length: int | None = None
        keep = self.keep_alive
        for name, value in headers:
            lower = name.lower()
            if lower == "content-length":
                length = int(value)
            elif lower == "connection" and value.lower() == "close":
                keep = False  # a 408, or a 400 for bad framing: the rest of the connection is not trusted
        no_body = self.request.method == "HEAD" or code in (204, 304) or code < 200
        chunked = False
        if not no_body and length is None:
            if self.request.version == "1.1":
                chunked = True
            else:
                keep = False  # HTTP/1.0: the body ends with the connection
        self._left, self._no_body, self._chunked, self.keep_alive = length, no_body, chunked, keep
        self._head = response_head(self.request.version, status, headers, keep, chunked)
        return self.write

    def write(self, data: bytes) -> None:
        if self._head is None:
            raise AssertionError("write() before start_response()")
        if self._no_body or not data:
            data = b""
        elif self._chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        elif self._left is not None:
            data = data[: self._left]
            self._left -= len(data)
        if not self.started:
            self.started = True
            data, self._head = self._head + data, b""
        if data:
            self._sock.sendall(data)

    def finish(self) -> None:
        """The answer's end: its head, if no body byte was written, and a chunked body's last chunk."""
        if self._head is None:
            raise AssertionError("the application returned without calling start_response()")
        tail = b"0\r\n\r\n" if self._chunked else b""
        if not self.started:
            self.started = True
            tail = self._head + tail
        if tail:
            self._sock.sendall(tail)
        if self._left:  # fewer bytes than it declared: the client waits for the rest; only closing ends it
            self.keep_alive = False
