"""The sync poller's look at a socket (servers/gunicorn_early.py): which bytes make a whole request it may answer,
and how it writes gunicorn's answer. Real sockets (a connected pair); the worker's use is in
tests/live/hardening/test_early_refusal.py, against gunicorn itself."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from twinserve.servers.gunicorn_early import CLOSED, Peeked, peek_request, render

#: gunicorn's defaults (its `limit_request_*` settings).
CFG = SimpleNamespace(limit_request_line=4094, limit_request_fields=100, limit_request_field_size=8190)
BODY = b'{"instances": [1]}'
HEAD = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\n"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    server, client = socket.socketpair()
    server.setblocking(False)  # as gthread's poller holds a kept-alive connection
    yield server, client
    server.close()
    client.close()


def _peek(pair: tuple[socket.socket, socket.socket], data: bytes, cfg: object = CFG) -> Peeked | None:
    server, client = pair
    client.sendall(data)
    peeked = peek_request(server, cfg)
    assert not isinstance(peeked, str)  # CLOSED: the client is still there
    return peeked


def test_a_connection_its_client_closed_is_found_closed(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    client.sendall(b"POST /")
    client.shutdown(socket.SHUT_WR)
    assert peek_request(server, CFG) is None  # bytes before the end of file: the thread's to answer (400)
    server.recv(100)
    assert peek_request(server, CFG) == CLOSED


def test_a_whole_request_is_found_and_left_in_the_socket(pair: tuple[socket.socket, socket.socket]) -> None:
    peeked = _peek(pair, HEAD + BODY)
    assert peeked is not None
    assert (peeked.method, peeked.url) == (b"POST", b"/v1/models/m:predict")
    assert (peeked.version, peeked.keep_alive) == ("1.1", True)
    assert peeked.headers == [(b"host", b"x"), (b"content-length", b"18")]
    assert peeked.size == len(HEAD + BODY)
    assert pair[0].recv(65536) == HEAD + BODY  # only looked at: every byte is still there for a thread


def test_a_pipelined_request_behind_it_is_not_counted(pair: tuple[socket.socket, socket.socket]) -> None:
    peeked = _peek(pair, HEAD + BODY + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert peeked is not None and peeked.size == len(HEAD + BODY)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(HEAD + BODY[:5], id="body-not-all-in"),
        pytest.param(HEAD[:30], id="head-not-all-in"),
        pytest.param(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", id="not-a-post"),
        pytest.param(
            HEAD.replace(b"Content-Length: 18", b"Transfer-Encoding: chunked") + b"12\r\n" + BODY + b"\r\n0\r\n\r\n",
            id="chunked",
        ),
        pytest.param(HEAD.replace(b"Host: x\r\n", b"Host: x\n") + BODY, id="bare-lf"),
        pytest.param(HEAD.replace(b"Host: x", b"Ho st: x") + BODY, id="malformed"),
        pytest.param(HEAD.replace(b"Length: 18", b"Length: 18\r\nContent-Length: 19") + BODY, id="two-lengths"),
        pytest.param(HEAD.replace(b"m:predict", b"m:predict?" + b"q" * 5000) + BODY, id="request-line-past-limit"),
        pytest.param(HEAD.replace(b"Host: x", b"Host: " + b"x" * 9000) + BODY, id="field-past-limit"),
        pytest.param(HEAD.replace(b"Host: x", b"Host: x" + b"\r\nX-A: 1" * 101) + BODY, id="too-many-fields"),
        pytest.param(b"", id="nothing"),
    ],
)
def test_what_a_thread_must_read_is_left_to_it(pair: tuple[socket.socket, socket.socket], data: bytes) -> None:
    assert _peek(pair, data) is None


@pytest.mark.parametrize(
    ("version", "connection", "keep_alive"),
    [("1.1", None, True), ("1.1", b"close", False), ("1.0", None, False), ("1.0", b"Keep-Alive", True)],
)
def test_keep_alive_by_gunicorns_rule(
    pair: tuple[socket.socket, socket.socket], version: str, connection: bytes | None, keep_alive: bool
) -> None:
    head = HEAD.replace(b"HTTP/1.1", b"HTTP/" + version.encode())
    if connection is not None:
        head = head.replace(b"Host: x", b"Host: x\r\nConnection: " + connection)
    peeked = _peek(pair, head + BODY)
    assert peeked is not None and (peeked.version, peeked.keep_alive) == (version, keep_alive)


def test_the_answer_is_written_as_gunicorns_response_writes_it() -> None:
    answer = render("1.1", "503 SERVICE UNAVAILABLE", [("Retry-After", "1"), ("Content-Length", "2")], b"{}", False)
    head, body = answer.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 SERVICE UNAVAILABLE" and lines[1] == b"Server: gunicorn"
    assert lines[2].startswith(b"Date: ")
    assert lines[3:] == [b"Connection: close", b"Retry-After: 1", b"Content-Length: 2"]
    assert body == b"{}"


def test_a_socket_that_cannot_be_peeked_at_is_left_to_a_thread() -> None:
    class TlsLike:  # ssl.SSLSocket.recv refuses flags with ValueError
        def recv(self, size: int, flags: int = 0) -> bytes:
            raise ValueError("non-zero flags not allowed in calls to recv() on <class 'ssl.SSLSocket'>")

    assert peek_request(TlsLike(), CFG) is None  # type: ignore[arg-type]
