"""How twinserve's gunicorn workers read a request: within a deadline, with gunicorn's parse errors in its terms.

gunicorn reads a request's head and body in the thread that serves it, and bounds no read by default. Two things
here bound them, for both worker classes (gunicorn_workers.py):

- `DeadlineSocket`: every blocking read gives up at `--read-timeout-s` of silence *and* at the deadline of the
  part being read: the head must arrive within `--read-timeout-s` of its first byte, the body within
  `--read-timeout-s` of the head's end. A client that trickles a byte every few seconds (never a long pause)
  therefore holds a request thread for `--read-timeout-s` at most, not for ever. A late head reads as a closed
  connection (gunicorn closes it quietly); a late body raises TimeoutError, which the front answers with 408.
- `BodyInput`: `wsgi.input`, whose reads raise twinserve's errors for a body gunicorn cannot parse (a bad chunk
  size, a missing chunk terminator) instead of gunicorn's exceptions, which the front would take for a bug (500).

`parse_error` is the one mapping from gunicorn's parser exceptions to twinserve's errors.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from gunicorn.http.errors import (
    ConfigurationProblem,
    ForbiddenProxyRequest,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    LimitRequestHeaders,
    LimitRequestLine,
    NoMoreData,
    ParseException,
)

from twinserve.errors import ClientError, HeadersTooLarge, MalformedHttp, TwinserveError, UriTooLong

__all__ = [
    "BodyInput",
    "DeadlineSocket",
    "Reading",
    "adopt",
    "done_reading",
    "parse_error",
    "read_from_now",
    "reading",
    "socket_class",
]

logger = logging.getLogger("twinserve.gunicorn")

T = TypeVar("T")

#: Not the client's fault: gunicorn's own answer (500, or 403 for a proxy line) stands.
_SERVER_SIDE = (ConfigurationProblem, ForbiddenProxyRequest, InvalidResponseHeader, InvalidResponseHeaderName)


def parse_error(exc: BaseException) -> TwinserveError | None:
    """twinserve's error for a request gunicorn's parser refused; None for an exception that is not the client's.

    An unsupported transfer coding gets 400 like every other framing error (gunicorn says 501): uvicorn's parser
    cannot tell it apart, and the same request gets the same answer in every architecture.
    """
    if isinstance(exc, LimitRequestLine):
        return UriTooLong()
    if isinstance(exc, LimitRequestHeaders):
        return HeadersTooLarge()
    if isinstance(exc, ParseException) and not isinstance(exc, _SERVER_SIDE):
        return MalformedHttp(private=str(exc))
    return None


@dataclass
class Reading:
    """The part of a request a thread is reading (its head, else its body) and when it must have arrived by."""

    deadline: float
    head: bool


_now = threading.local()


def reading() -> Reading | None:
    """What this thread is reading now; None outside a request."""
    current: Reading | None = getattr(_now, "reading", None)
    return current


def read_from_now(timeout: float, *, head: bool) -> None:
    """Start this thread's deadline for a request's head (`head=True`) or body, `timeout` seconds from now."""
    _now.reading = Reading(time.monotonic() + timeout, head)


def done_reading() -> None:
    """This thread's request is over: its reads are bounded by the pause timeout alone again."""
    _now.reading = None


class DeadlineSocket(socket.socket):
    """A connection whose blocking reads end at `read_timeout` seconds of silence or at this thread's deadline.

    gthread switches each connection between non-blocking (in its poller) and blocking (in a request thread) with
    `setblocking`, which would clear a plain `settimeout`; here blocking means blocking with a bound. Installed by
    changing an accepted socket's class (`socket_class`): the layout is socket.socket's, only behaviour changes.
    """

    __slots__ = ()
    read_timeout: float = 30.0

    def setblocking(self, flag: bool) -> None:
        self.settimeout(type(self).read_timeout if flag else 0.0)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        current = reading()
        prior = self.gettimeout()
        if current is None or prior == 0.0:  # outside a request, or the poller's non-blocking use
            return super().recv(bufsize, flags)
        try:
            left = current.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            # A smaller timeout someone set (gunicorn's bounded body drain) still applies.
            self.settimeout(left if prior is None else min(prior, left))
            return super().recv(bufsize, flags)
        except TimeoutError:
            if current.head:
                return b""  # gunicorn takes it for a client that left, and closes the connection quietly
            raise
        finally:
            self.settimeout(prior)


def socket_class(read_timeout: float) -> type[DeadlineSocket]:
    """A `DeadlineSocket` class with this worker's `--read-timeout-s`."""
    return type("DeadlineSocket", (DeadlineSocket,), {"__slots__": (), "read_timeout": read_timeout})


def adopt(sock: Any, cls: type[DeadlineSocket]) -> None:
    """Give a plain accepted socket the deadline reads (a TLS-wrapped one keeps its own class)."""
    if type(sock) is socket.socket:
        sock.__class__ = cls


class BodyInput:
    """gunicorn's `wsgi.input`, raising twinserve's errors for a body that is not valid HTTP/1.1 framing.

    A TimeoutError (the read deadline) passes through: the front answers it with 408.
    """

    def __init__(self, body: Any) -> None:
        self._body = body

    def read(self, size: int | None = None) -> bytes:
        data: bytes = _translated(self._body.read, size)
        return data

    def readline(self, size: int | None = None) -> bytes:
        line: bytes = _translated(self._body.readline, size)
        return line

    def readlines(self, size: int | None = None) -> list[bytes]:
        lines: list[bytes] = _translated(self._body.readlines, size)
        return lines

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


def _translated(read: Callable[[int | None], T], size: int | None) -> T:
    try:
        return read(size)
    except NoMoreData:
        raise ClientError("the request body ended before its last chunk", headers={"Connection": "close"}) from None
    except ParseException as exc:
        error = parse_error(exc)
        if error is None:
            raise
        logger.debug("refused a request body: %s", exc)
        raise error from None
