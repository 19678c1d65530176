"""HTTP/1.1 request heads under limits, read the same way by both of twinserve's HTTP servers: the sync worker
(servers/sync/http.py) and the async protocol under uvicorn (servers/asgi/).

`HeadReader` runs llhttp (httptools) over a connection's bytes with the limits gunicorn's parser enforced: a request
target past `--max-request-line` is 414, a header field past `--max-header-bytes`, more than `--max-header-count` of
them, or a head past their sum is 431; anything llhttp refuses is 400 `malformed_http`. llhttp sets no limit of its
own, and httptools buffers a header until it is complete, so without these a client could send one header without
end: the bytes of a request's head are bounded as they arrive, the whole head at most the request line plus the
header fields allowed, each at its longest. What a request's head, body and end turn into is the subclass's
(`on_headers_complete`, `on_body`, `on_message_complete`, llhttp's callbacks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import httptools

from twinserve.errors import HeadersTooLarge, MalformedHttp, TwinserveError, UriTooLong

if TYPE_CHECKING:
    from twinserve.config import Config

__all__ = ["HeadReader", "Limits", "ParseError"]


class ParseError(Exception):
    """A request the parser refused: its answer (414, 431, 400), after which the connection closes."""

    def __init__(self, error: TwinserveError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_line: int
    max_header_count: int
    max_header_bytes: int
    max_body_bytes: int

    @classmethod
    def of(cls, config: Config) -> Limits:
        """The limits `config` sets, which twinserve's HTTP servers (sync and async) enforce alike."""
        return cls(config.max_request_line, config.max_header_count, config.max_header_bytes, config.max_body_bytes)

    @property
    def max_head(self) -> int:
        return self.max_request_line + self.max_header_count * (self.max_header_bytes + 2)


class HeadReader:
    """llhttp over one connection's bytes, its request heads bounded (see the module). `feed` raises ParseError;
    `url` and `headers` (names lower-cased) are the last request's whose head began, kept until the next begins."""

    __slots__ = ("_count", "_head_bytes", "_in_head", "_max_head", "headers", "limits", "parser", "started", "url")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._max_head = limits.max_head
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self._count = 0
        self._head_bytes = 0
        self._in_head = False
        #: Whether a request's head has begun and its message not ended.
        self.started = False

    def feed(self, data: bytes) -> int | None:
        """Parse `data`: None, or where the bytes of another protocol begin in it after a request asking to switch
        (an `Upgrade` whose head llhttp has just read; nothing after it is HTTP)."""
        counting = self._in_head or not self.started
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            return int(upgrade.args[0]) if upgrade.args else len(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, ParseError):
                raise cause from None
            raise ParseError(MalformedHttp(private=str(exc))) from None
        except httptools.HttpParserError as exc:
            raise ParseError(MalformedHttp(private=str(exc))) from None
        # Counted after parsing, so that a read which ends the head and carries a body is not held against it; what
        # httptools buffers stays bounded by the limit plus one read.
        if counting and self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head:
                raise ParseError(HeadersTooLarge())
        return None

    @property
    def in_head(self) -> bool:
        """Whether a request's head has begun and not ended."""
        return self._in_head

    # -- llhttp's callbacks ------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.headers, self._count, self._head_bytes = b"", [], 0, 0
        self._in_head = self.started = True

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.limits.max_request_line:
            raise ParseError(UriTooLong())

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a chunked body's trailer fields: never in the head a proxy or the app's checks saw
        self._count += 1
        if self._count > self.limits.max_header_count or len(name) + len(value) + 2 > self.limits.max_header_bytes:
            raise ParseError(HeadersTooLarge())
        # llhttp keeps a value's trailing whitespace, which is not part of it (RFC 9110 section 5.5).
        self.headers.append((name.lower(), value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        self._in_head = False

    def on_message_complete(self) -> None:
        self.started = False
