"""The sync worker's HTTP/1.1 (servers/sync/http.py, input.py, response.py): bytes in, requests out, answers written,
without a server. RFC 9110 / RFC 9112 framing: Content-Length and chunked bodies (RFC 9112 §6), persistence
(§9.3: HTTP/1.1 keeps the connection unless `Connection: close`, HTTP/1.0 closes unless `keep-alive`), and
`Expect: 100-continue` (RFC 9110 §10.1.1). The served path is the hardening suite's (tests/live/hardening)."""

from __future__ import annotations

import socket

import pytest

from twinserve.errors import HeadersTooLarge, MalformedHttp, UriTooLong
from twinserve.servers.http1 import Limits, ParseError
from twinserve.servers.sync.http import RequestReader, environ_of, response_head
from twinserve.servers.sync.input import BodyInput
from twinserve.servers.sync.response import ResponseWriter

LIMITS = Limits(max_request_line=200, max_header_count=10, max_header_bytes=100, max_body_bytes=64)


def _post(body: bytes, *headers: bytes, target: bytes = b"/v1/models/m:predict") -> bytes:
    head = [b"POST " + target + b" HTTP/1.1", b"Host: x", b"Content-Length: %d" % len(body), *headers]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _reader(*chunks: bytes) -> RequestReader:
    reader = RequestReader(LIMITS)
    for chunk in chunks:
        reader.feed(chunk)
    return reader


def test_a_whole_request_comes_out_with_its_body_and_lower_cased_names() -> None:
    reader = _reader(_post(b'{"instances": [1]}', b"X-Priority: 2"))
    (request,) = reader.heads
    assert (request.method, request.target, request.version) == ("POST", b"/v1/models/m:predict", "1.1")
    assert request.complete and request.keep_alive and bytes(request.body) == b'{"instances": [1]}'
    assert request.header(b"x-priority") == b"2" and request.header(b"host") == b"x"
    assert not reader.started and reader.current is None


def test_a_body_in_pieces_is_whole_only_at_its_last_byte() -> None:
    whole = _post(b"0123456789")
    reader = _reader(whole[:-4])
    (request,) = reader.heads
    assert not request.complete and reader.current is request and reader.started
    reader.feed(whole[-4:])
    assert request.complete and bytes(request.body) == b"0123456789" and not reader.started


def test_pipelined_requests_come_out_in_order() -> None:
    reader = _reader(_post(b"a") + _post(b"bb") + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert [bytes(r.body) for r in reader.heads] == [b"a", b"bb", b""]
    assert all(r.complete for r in reader.heads) and reader.heads[2].method == "GET"


def test_a_chunked_body_is_read_whole_and_its_length_given_to_the_app() -> None:
    head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    (request,) = _reader(head + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").heads
    assert request.chunked and request.complete and bytes(request.body) == b"abcde"
    environ = environ_of(request, ("127.0.0.1", 8000), ("127.0.0.1", 5555), False)
    assert environ["CONTENT_LENGTH"] == "5" and environ["wsgi.input_terminated"]


def test_http_1_0_closes_unless_it_asks_to_keep_alive_and_1_1_keeps_unless_it_asks_to_close() -> None:
    get = b"GET / HTTP/1.0\r\n\r\n"
    assert not _reader(get).heads[0].keep_alive
    assert _reader(get.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive\r\n\r\n")).heads[0].keep_alive
    assert not _reader(_post(b"", b"Connection: close")).heads[0].keep_alive


def test_a_body_past_the_limit_is_not_read_on() -> None:
    (declared,) = _reader(_post(b"x" * 65)).heads  # its Content-Length says so: the app refuses it 413
    assert declared.too_large and declared.body == b""
    head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    (chunked,) = _reader(head + b"40\r\n" + b"x" * 64 + b"\r\n", b"10\r\n" + b"y" * 16 + b"\r\n").heads
    assert chunked.too_large and len(chunked.body) == LIMITS.max_body_bytes + 1  # the app sees max + 1: 413


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"GET /" + b"a" * 201 + b" HTTP/1.1\r\n\r\n", UriTooLong),
        (_post(b"", b"X-Long: " + b"v" * 100), HeadersTooLarge),
        (_post(b"", *[b"X-%d: 1" % i for i in range(10)]), HeadersTooLarge),
        (b"POST / HTTP/1.1\r\nX-Never-Ends: " + b"v" * 1200, HeadersTooLarge),  # a head past the limits' sum
        (b"GE T / HTTP/1.1\r\n\r\n", MalformedHttp),
        (_post(b"ab", b"Transfer-Encoding: chunked"), MalformedHttp),  # both framings: RFC 9112 6.1
        (b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", MalformedHttp),
    ],
    ids=["target", "field", "count", "head", "request-line", "length-and-chunked", "length"],
)
def test_the_parser_refuses_with_the_status_gunicorn_and_uvicorn_give(raw: bytes, error: type) -> None:
    with pytest.raises(ParseError) as refused:
        _reader(raw)
    assert isinstance(refused.value.error, error)


def test_an_upgrade_is_the_apps_to_answer_and_nothing_after_its_head_is_parsed() -> None:
    handshake = b"GET /v1/models/m/stream HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    reader = _reader(handshake + b"\x81\x05hello")
    (request,) = reader.heads
    assert request.complete and not request.keep_alive and reader.upgraded
    reader.feed(b"not HTTP at all")  # the other protocol's bytes: ignored, no error
    assert len(reader.heads) == 1


def test_the_environ_follows_pep_3333() -> None:
    raw = _post(b"{}", b"X-A: 1", b"X-A: 2", b"X_Sneaky: 1", b"Content-Type: application/json")
    (request,) = _reader(raw.replace(b"m:predict", b"caf%C3%A9:predict?x=1")).heads
    environ = environ_of(request, ("0.0.0.0", 8000), ("127.0.0.1", 5555), True)
    assert environ["PATH_INFO"] == "/v1/models/café:predict".encode().decode("latin-1")  # bytes as latin-1
    assert (environ["QUERY_STRING"], environ["SERVER_PORT"], environ["REMOTE_PORT"]) == ("x=1", "8000", "5555")
    assert environ["HTTP_X_A"] == "1,2" and "HTTP_X_SNEAKY" not in environ  # an underscore would read as a dash
    assert (environ["CONTENT_TYPE"], environ["CONTENT_LENGTH"]) == ("application/json", "2")
    assert environ["wsgi.multiprocess"] and environ["SERVER_PROTOCOL"] == "HTTP/1.1"


def test_a_body_late_past_the_read_timeout_raises_as_a_socket_read_would() -> None:
    (request,) = _reader(_post(b"0123456789")[:-3]).heads
    request.timed_out = True
    with pytest.raises(TimeoutError):
        BodyInput(request).read()


def test_the_head_carries_server_date_and_connection_then_the_apps_headers() -> None:
    head = response_head("1.1", "200 OK", [("Content-Type", "a/b"), ("Connection", "keep-alive")], False, True)
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and lines[1] == "Server: twinserve" and lines[2].startswith("Date: ")
    assert lines[3:] == ["Connection: close", "Content-Type: a/b", "Transfer-Encoding: chunked", "", ""]


def _written(raw: bytes, status: str, headers: list[tuple[str, str]], chunks: list[bytes]) -> tuple[bytes, bool]:
    (request,) = _reader(raw).heads
    ours, theirs = socket.socketpair()
    with ours, theirs:
        writer = ResponseWriter(ours, request, keep_alive=True)
        write = writer.start_response(status, headers)
        for chunk in chunks:
            write(chunk)
        writer.finish()
        ours.shutdown(socket.SHUT_WR)
        answer = b"".join(iter(lambda: theirs.recv(65536), b""))
    return answer, writer.keep_alive


def test_a_body_of_known_length_goes_as_it_is_one_of_unknown_length_chunked() -> None:
    known, keep = _written(_post(b""), "200 OK", [("Content-Length", "5")], [b"he", b"llo"])
    assert known.endswith(b"\r\n\r\nhello") and keep
    unknown, keep = _written(_post(b""), "200 OK", [("Content-Type", "text/event-stream")], [b"data: 1\n\n", b"x"])
    assert b"Transfer-Encoding: chunked" in unknown and keep
    assert unknown.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n1\r\nx\r\n0\r\n\r\n")


def test_a_head_request_gets_no_body_and_an_apps_connection_close_is_kept() -> None:
    head_only, _ = _written(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", "200 OK", [("Content-Length", "5")], [b"hello"])
    assert head_only.endswith(b"Content-Length: 5\r\n\r\n")
    closing, keep = _written(_post(b""), "408 REQUEST TIMEOUT", [("Connection", "close"), ("Content-Length", "0")], [])
    assert not keep and b"Connection: close\r\n" in closing and closing.count(b"Connection:") == 1
