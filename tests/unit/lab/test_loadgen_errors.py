"""The load generator tells failures apart: each HTTP error by status and the server's error code from its JSON
body (`503 queue_full`), each failed connect by how it failed. Sans-IO: the parser fed bytes, the tally fed
outcomes, a connection fed a response; no socket."""

from __future__ import annotations

import asyncio

import pytest

from twinserve.lab.loadgen.connection import _connect_outcome, _Wire
from twinserve.lab.loadgen.http import MAX_ERROR_BODY, ResponseParser
from twinserve.lab.loadgen.tally import TRANSPORT_ERROR_KINDS, LevelResult, Tally


def response(status: str, body: bytes, *, chunked: bool = False) -> bytes:
    if chunked:
        framed = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:]) if part) + b"0\r\n\r\n"
        return b"HTTP/1.1 " + status.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
    return b"HTTP/1.1 " + status.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body


TWINSERVE = b'{"error": {"code": "queue_full", "message": "the queue is full", "request_id": "r1"}}'
V1 = b'{"error": "the \\"code\\": \\"fake\\" queue is full", "code": "queue_full", "request_id": "r1"}'


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (response("503 Service Unavailable", TWINSERVE), b"queue_full"),
        (response("503 Service Unavailable", V1), b"queue_full"),  # a code quoted inside the message is not it
        (response("503 Service Unavailable", TWINSERVE, chunked=True), b"queue_full"),
        (response("500 Internal Server Error", b'{"error": "model failed"}'), None),  # V2: no code
        (response("502 Bad Gateway", b"<html>bad gateway</html>"), None),
        (response("200 OK", b'{"predictions": [{"code": "x"}]}'), None),  # a 2xx body is not read
    ],
)
def test_the_parser_reads_the_servers_error_code(wire: bytes, code: bytes | None) -> None:
    parser = ResponseParser()
    assert parser.feed(wire)
    assert parser.error_code() == code


def test_the_code_is_read_across_pieces_and_reset_for_the_next_response() -> None:
    parser = ResponseParser()
    wire = response("429 Too Many Requests", b'{"error": {"code": "rate_limited", "message": "slow down"}}')
    assert not parser.feed(wire[:40]) and not parser.feed(wire[40:60])
    assert parser.feed(wire[60:]) and parser.error_code() == b"rate_limited"
    assert parser.feed(response("200 OK", b"{}")) and parser.error_code() is None


def test_only_the_start_of_a_long_error_body_is_kept() -> None:
    parser = ResponseParser()
    body = b'{"error": {"message": "' + b"x" * (3 * MAX_ERROR_BODY) + b'", "code": "late"}}'
    step = MAX_ERROR_BODY // 2
    wire = response("500 Internal Server Error", body)
    done = False
    for at in range(0, len(wire), step):  # in pieces, as a socket delivers a long body
        done = parser.feed(wire[at : at + step])
    assert done and parser.error_code() is None  # past what is kept: the status alone counts


def test_http_errors_are_tallied_by_status_and_code() -> None:
    tally = Tally()
    for outcome, code in [(503, b"queue_full"), (503, b"queue_full"), (503, None), (500, b"model_failed"), (200, None)]:
        tally.record(outcome, 0.0, 0.0, 0.01, 1.0, code)
    tally.record("timeout", 0.0, 0.0, 0.5, 1.0)
    assert tally.error_codes() == {"500 model_failed": 1, "503": 1, "503 queue_full": 2}
    assert dict(tally.http_errors) == {"503": 3, "500": 1}  # by status, as before


def test_a_levels_errors_by_kind_join_http_codes_and_transport_failures() -> None:
    level = LevelResult(
        mode="open",
        concurrency=None,
        rate=100.0,
        achieved_rate=100.0,
        duration_s=1.0,
        sent=100,
        ok=90,
        http_errors={"503": 7},
        transport_errors={**dict.fromkeys(TRANSPORT_ERROR_KINDS, 0), "timeout": 2, "connect_timeout": 1},
        throughput_rps=97.0,
        latency_ms={},
        service_time_ms={},
        generator_cpu_percent=10.0,
        generator_limited=False,
        connections_used=8,
        pool_exhausted=False,
        http_error_codes={"503 queue_full": 7},
    )
    assert level.errors_by_kind() == {"503 queue_full": 7, "timeout": 2, "connect_timeout": 1}


def test_a_failed_connect_says_how_it_failed() -> None:
    assert _connect_outcome(ConnectionRefusedError()) == "connect_refused"
    assert _connect_outcome(TimeoutError()) == "connect_timeout"
    assert _connect_outcome(OSError(24, "Too many open files")) == "connect_error"
    assert {"connect_refused", "connect_timeout", "connect_error", "timeout"} <= set(TRANSPORT_ERROR_KINDS)


class _Slot:
    """What a `_Wire` reports to: here, a list of what it reported."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.clock = self
        self.reported: list[tuple[int, bytes | None]] = []

    def arrived(self, whole: bool) -> float:
        return 1.0

    def on_response(self, status: int, finished: float, code: bytes | None = None) -> None:
        self.reported.append((status, code))


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def test_a_connection_reports_each_answer_with_its_code() -> None:
    loop = asyncio.new_event_loop()
    try:
        slot = _Slot(loop)
        wire = _Wire(slot)  # type: ignore[arg-type]
        wire.connection_made(_Transport())  # type: ignore[arg-type]
        for answer in (response("503 Service Unavailable", TWINSERVE), response("200 OK", b"{}")):
            wire.send(b"POST / HTTP/1.1\r\n\r\n")
            wire.data_received(answer)
        assert slot.reported == [(503, b"queue_full"), (200, None)]
    finally:
        loop.close()
