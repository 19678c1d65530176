"""The sync architecture's read deadlines and parser-error mapping (servers/gunicorn_reads.py), in-process."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from gunicorn.http.errors import (
    InvalidChunkSize,
    InvalidHeader,
    InvalidRequestLine,
    InvalidResponseHeader,
    LimitRequestHeaders,
    LimitRequestLine,
    NoMoreData,
    UnsupportedTransferCoding,
)

from twinserve.errors import ClientError, HeadersTooLarge, MalformedHttp, UriTooLong
from twinserve.servers.gunicorn_reads import BodyInput, adopt, done_reading, parse_error, read_from_now, socket_class

DEADLINE_S = 0.5


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (LimitRequestLine(9000, 8190), UriTooLong),
        (LimitRequestHeaders("too many"), HeadersTooLarge),
        (InvalidRequestLine("GARBAGE"), MalformedHttp),
        (InvalidHeader("CONTENT-LENGTH"), MalformedHttp),
        (UnsupportedTransferCoding("gzip"), MalformedHttp),
        (InvalidChunkSize(b"-5"), MalformedHttp),
    ],
)
def test_the_clients_parse_errors_map_to_twinserve_errors(exc: Exception, error: type[ClientError]) -> None:
    mapped = parse_error(exc)
    assert type(mapped) is error
    assert mapped.status in (400, 414, 431)


def test_the_servers_own_faults_stay_gunicorns() -> None:
    assert parse_error(InvalidResponseHeader("x")) is None  # the app sent a bad header: a 500, not the client's
    assert parse_error(ValueError("x")) is None


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    server, client = socket.socketpair()
    adopt(server, socket_class(read_timeout=5.0))
    server.setblocking(True)
    try:
        yield server, client
    finally:
        done_reading()
        server.close()
        client.close()


def trickle(client: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(DEADLINE_S / 10):  # never a pause near the read timeout
        try:
            client.sendall(b"x")
        except OSError:
            return


def read_until_it_ends(server: socket.socket) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        while server.recv(1024):
            pass
    except TimeoutError as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


@pytest.mark.parametrize("head", [True, False])
def test_a_trickle_ends_at_the_deadline(pair: tuple[socket.socket, socket.socket], head: bool) -> None:
    server, client = pair
    stop = threading.Event()
    thread = threading.Thread(target=trickle, args=(client, stop), daemon=True)
    thread.start()
    try:
        read_from_now(DEADLINE_S, head=head)
        waited, raised = read_until_it_ends(server)
    finally:
        stop.set()
        thread.join()
    assert waited >= DEADLINE_S * 0.9
    # A late head reads as a closed connection (gunicorn closes it quietly); a late body times out (408).
    assert (raised is None) if head else isinstance(raised, TimeoutError)


def test_outside_a_request_only_the_pause_bound_applies(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    read_from_now(0.0, head=False)
    done_reading()
    client.sendall(b"abc")
    assert server.recv(3) == b"abc"
    assert server.gettimeout() == 5.0  # and the read left the socket's own timeout as it was


class _Reader:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def read(self, size: int | None = None) -> bytes:
        raise self.exc


def test_body_input_raises_twinserve_errors() -> None:
    with pytest.raises(MalformedHttp) as refused:
        BodyInput(_Reader(InvalidChunkSize(b"-5"))).read()
    assert refused.value.headers["Connection"] == "close"
    with pytest.raises(ClientError, match="before its last chunk"):
        BodyInput(_Reader(NoMoreData(b""))).read()
    with pytest.raises(TimeoutError):  # the deadline: the front answers it with 408
        BodyInput(_Reader(TimeoutError())).read()
    assert BodyInput(io.BytesIO(b"a\nb\n")).readlines() == [b"a\n", b"b\n"]
