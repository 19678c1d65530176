"""The load generator's HTTP/1.1 wire format: the target and its requests encoded up front (`Endpoint`), and
the sans-IO framing of responses (`ResponseParser`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_HOSTS", "MAX_ERROR_BODY", "MAX_HEAD_BYTES", "Endpoint", "ResponseParser"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})
#: A response head, chunk-size line or trailer field longer than this is malformed.
MAX_HEAD_BYTES = 1 << 16
#: The response fields that frame it, in a lower-cased head; one pass over the head finds them all.
_FRAMING_FIELDS = re.compile(rb"\r\n(content-length|transfer-encoding|connection):[ \t]*([^\r]*)")
#: The server's error code in an error body: twinserve's `{"error": {"code": ...}}` and V1's `{"error": ..., "code":
#: ...}` both name it so (a code inside the message is escaped, `\"code\"`, and does not match).
_ERROR_CODE = re.compile(rb'"code"\s*:\s*"([A-Za-z0-9_.-]{1,64})"')
#: Of an error response's body, this much is kept to read its code from.
MAX_ERROR_BODY = 4096


@dataclass(frozen=True)
class Endpoint:
    """Where a level's requests go, parsed from its URL once."""

    port: int
    authority: str
    target: str
    #: Where connections go: the literal 127.0.0.1 for loopback (even for "localhost": no resolver call per
    #: connection, no IPv6 detour), else the host as the URL names it.
    address: str = "127.0.0.1"

    @classmethod
    def parse(cls, url: str, remote: bool = False) -> Endpoint:
        """`url`'s parts; a host other than this machine only with `remote` (a deliberate choice: see LoadSpec)."""
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"the load generator speaks plain http:// only, not {url!r}")
        if not parts.hostname or (parts.hostname not in LOOPBACK_HOSTS and not remote):
            raise ValueError(f"the load generator drives loopback servers only (127.0.0.1 or localhost), not {url!r}")
        port = parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        address = "127.0.0.1" if parts.hostname in LOOPBACK_HOSTS else parts.hostname
        return cls(port, f"{parts.hostname}:{port}", target, address)

    def requests(self, extra_headers: Mapping[str, str], bodies: Sequence[bytes]) -> list[bytes]:
        """Every distinct request of the level (a `LoadSpec`'s headers and bodies), encoded once."""
        headers = {"host": ("Host", self.authority), "content-type": ("Content-Type", "application/json")}
        headers.update((name.lower(), (name, value)) for name, value in extra_headers.items())
        head = f"POST {self.target} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.values())
        return [f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body for body in bodies]


#: Parser states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE, _DONE = range(7)


class ResponseParser:
    """Sans-IO framing of HTTP/1.x responses: `feed` it bytes as they come and it says when a response is whole.

    Interim (1xx) responses are skipped; bodies are counted, not kept, except the first `MAX_ERROR_BODY` bytes of
    an error response's (a status of 300 or more), where `error_code` finds the server's code.
    """

    __slots__ = ("_buffer", "_error_body", "_remaining", "_state", "keep_alive", "status")

    def __init__(self) -> None:
        self._buffer = b""
        self._state = _HEAD
        self._remaining = 0
        self.status = 0
        self.keep_alive = True
        self._error_body: bytearray | None = None

    def error_code(self) -> bytes | None:
        """The server's error code (`queue_full`) in the JSON body of the error response just read; None for a
        2xx, or a body that names none."""
        body = self._error_body
        if not body:
            return None
        found = _ERROR_CODE.search(body)
        return found.group(1) if found else None

    @property
    def between_responses(self) -> bool:
        """Nothing of the next response read yet."""
        return self._state == _HEAD and not self._buffer

    @property
    def ends_at_close(self) -> bool:
        """The body runs to the end of the connection, so the connection closing completes it."""
        return self._state == _UNTIL_CLOSE

    def feed(self, data: bytes) -> bool:
        """Take in the next bytes; True once they complete the response, whose `status` and `keep_alive` then hold.

        Raises ValueError where the bytes are not an HTTP/1.x response.
        """
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        pos, size, state = 0, len(data), self._state
        while state != _DONE:
            if state in (_LENGTH, _CHUNK_DATA):
                take = min(self._remaining, size - pos)
                if self._error_body is not None and len(self._error_body) < MAX_ERROR_BODY:
                    self._error_body += data[pos : pos + take]
                pos += take
                self._remaining -= take
                if self._remaining:
                    break
                state = _DONE if state == _LENGTH else _CHUNK_SIZE
            elif state == _UNTIL_CLOSE:
                if self._error_body is not None and len(self._error_body) < MAX_ERROR_BODY:
                    self._error_body += data[pos:]
                break
            else:
                end = data.find(b"\r\n\r\n" if state == _HEAD else b"\r\n", pos)
                if end < 0:
                    if size - pos > MAX_HEAD_BYTES:
                        raise ValueError(f"no end to a response line or head in {MAX_HEAD_BYTES} bytes")
                    self._buffer = data[pos:]
                    break
                if state == _HEAD:
                    status, keep_alive, state, self._remaining = _framing(data[pos : end + 2])
                    if state != _HEAD:  # else an interim (1xx) response, skipped
                        self.status, self.keep_alive = status, keep_alive
                        self._error_body = bytearray() if status >= 300 else None
                    pos = end + 4
                    continue
                line, pos = data[pos:end], end + 2
                if state == _TRAILER:
                    state = _TRAILER if line else _DONE
                    continue
                self._remaining = int(line.split(b";", 1)[0], 16)
                if self._remaining < 0:
                    raise ValueError(f"negative chunk size {line!r}")
                state = _CHUNK_DATA if self._remaining else _TRAILER
                self._remaining += 2  # the chunk's closing CRLF
        if state != _DONE:
            self._state = state
            return False
        if pos < size:  # bytes beyond the response that no request asked for: the framing is lost
            self.keep_alive = False
        self._state = _HEAD
        return True


@functools.lru_cache(maxsize=256)
def _framing(head: bytes) -> tuple[int, bool, int, int]:
    """A response head's (through its last field's CRLF) status, keep-alive, the parser state that follows, and the
    body length where that state is `_LENGTH`.

    Cached, since a server sends the same few heads again and again; what varies, like a Date field, varies slowly.
    """
    if not head.startswith(b"HTTP/1.") or head[12:13] not in (b" ", b"\r"):
        raise ValueError(f"not an HTTP/1.x status line: {head[:40]!r}")
    status = int(head[9:12])
    if 100 <= status < 200:
        return status, True, _HEAD, 0
    fields = dict(_FRAMING_FIELDS.findall(head.lower()))
    connection = fields.get(b"connection", b"")
    keep_alive = b"close" not in connection if head.startswith(b"HTTP/1.1") else b"keep-alive" in connection
    if status in (204, 304):
        return status, keep_alive, _DONE, 0
    if b"chunked" in fields.get(b"transfer-encoding", b""):
        return status, keep_alive, _CHUNK_SIZE, 0
    if length := fields.get(b"content-length"):
        if (size := int(length)) < 0:
            raise ValueError(f"negative content-length {length!r}")
        return status, keep_alive, _LENGTH if size else _DONE, size
    return status, False, _UNTIL_CLOSE, 0
