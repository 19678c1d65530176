"""`wsgi.input` over a body the poller read whole (servers/sync/http.py `Request.body`)."""

from __future__ import annotations

import io
from collections.abc import Iterator

from twinserve.servers.sync.http import Request

__all__ = ["BodyInput"]


class BodyInput:
    """The request's body as a stream. One whose client stalled past the read timeout raises TimeoutError on the
    first read, as a socket read would: the front answers 408 (fronts/wsgi.py)."""

    __slots__ = ("_stream", "_timed_out")

    def __init__(self, request: Request) -> None:
        self._stream = io.BytesIO(request.body)
        self._timed_out = request.timed_out

    def _check(self) -> None:
        if self._timed_out:
            raise TimeoutError("the request body did not arrive within the read timeout")

    def read(self, size: int | None = -1) -> bytes:
        self._check()
        return self._stream.read(-1 if size is None else size)

    def readline(self, size: int | None = -1) -> bytes:
        self._check()
        return self._stream.readline(-1 if size is None else size)

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        self._check()
        return self._stream.readlines(-1 if hint is None else hint)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")
