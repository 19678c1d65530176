"""What a hostile client can still do at the transport (issue #20): trickled bodies, broken chunks, bad HTTP.

Raw sockets against real servers, the same answer expected from every architecture: a body trickled a byte at a
time is cut off at `--read-timeout-s` in total (408) while health checks keep answering, and every request the
HTTP server's parser refuses gets twinserve's JSON error body with the right status, no traceback in the log.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.live.hardening.conftest import READ_TIMEOUT_S
from tests.serving import HTTP, Server, scrape, wait_until

# serial: trickled bodies against --read-timeout-s while health checks must answer every time
pytestmark = [pytest.mark.hardening, pytest.mark.serial]

ECHO = "/v1/models/echo:predict"
#: More trickling connections than the sync server's request threads (--workers 1 --threads 4 in conftest).
TRICKLERS = 6
#: How long a trickled request may stay open: in sync, the tricklers past the thread count first wait for a thread
#: (at most one deadline), then get their own deadline; plus slack for a loaded machine.
CUT_OFF_WITHIN_S = 4 * READ_TIMEOUT_S
TRICKLE_EVERY_S = 0.5  # well under the read timeout: never one long pause


def head(path: str = ECHO, method: str = "POST", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines.extend(f"{name.replace('_', '-')}: {value}" for name, value in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Trickler:
    """One connection that sends a request head, then its body one byte (or one 1-byte chunk) at a time."""

    sock: socket.socket
    chunked: bool
    started: float = field(default_factory=time.monotonic)
    received: bytes = b""
    ended: float | None = None

    @classmethod
    def open(cls, port: int, chunked: bool) -> Trickler:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5 * READ_TIMEOUT_S)
        framing = {"Transfer_Encoding": "chunked"} if chunked else {"Content_Length": "1000"}
        sock.sendall(head(Content_Type="application/json", **framing))
        return cls(sock, chunked)

    def step(self) -> None:
        """Read what the server sent, if anything; else send the next byte. Marks the end when the server is done."""
        if self.ended is not None:
            return
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if readable:
                data = self.sock.recv(65536)
                self.received += data
                if not data or b"\r\n\r\n" in self.received:
                    self.end()
                return
            self.sock.sendall(b"1\r\n \r\n" if self.chunked else b" ")
        except OSError:  # reset or broken pipe: the server has closed the connection
            self.end()

    def end(self) -> None:
        self.ended = time.monotonic()
        self.sock.close()

    @property
    def status(self) -> int | None:
        """The status the server answered with, or None if it closed the connection without an answer."""
        if not self.received.startswith(b"HTTP/1.1 "):
            return None
        return int(self.received.split(b" ", 2)[1])


def health_checks(url: str, stop: threading.Event, statuses: list[int | str]) -> None:
    """GET /v2/health/live one after another until `stop`; each status, or the name of the transport error."""
    with httpx.Client(timeout=5 * READ_TIMEOUT_S) as client:
        while not stop.is_set():
            try:
                statuses.append(client.get(f"{url}/v2/health/live").status_code)
            except httpx.TransportError as exc:
                statuses.append(type(exc).__name__)


@pytest.mark.parametrize("arch", ARCHS)
def test_trickled_bodies_are_cut_off_while_health_checks_answer(arch: str, well_behaved: dict[str, Server]) -> None:
    server = well_behaved[arch]
    tricklers = [Trickler.open(server.port, chunked=i % 2 == 1) for i in range(TRICKLERS)]
    stop = threading.Event()
    statuses: list[int | str] = []
    checker = threading.Thread(target=health_checks, args=(server.url, stop, statuses), daemon=True)
    checker.start()
    try:
        give_up = time.monotonic() + 2 * CUT_OFF_WITHIN_S
        while any(t.ended is None for t in tricklers) and time.monotonic() < give_up:
            for trickler in tricklers:
                trickler.step()
            time.sleep(TRICKLE_EVERY_S / TRICKLERS)  # one byte per connection every TRICKLE_EVERY_S
        # The health checks ran while every request thread could have been held; one more after the cut-off.
        deadline = time.monotonic() + 5 * READ_TIMEOUT_S
        answered = len(statuses)
        while len(statuses) == answered and time.monotonic() < deadline and checker.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        checker.join(timeout=10 * READ_TIMEOUT_S)
        for trickler in tricklers:
            if trickler.ended is None:
                trickler.end()
    held = [round(t.ended - t.started, 1) if t.ended is not None else None for t in tricklers]
    assert all(t is not None and t <= CUT_OFF_WITHIN_S for t in held), f"held open for {held} s"
    # Cut at the deadline, not sooner: each pause was short.
    assert all(t is not None and t >= READ_TIMEOUT_S * 0.9 for t in held), held
    for trickler in tricklers:
        # 408, unless the server's close reset the connection before its answer was read.
        assert trickler.status in (408, None), trickler.received[:300]
        if trickler.status == 408:
            body = trickler.received.split(b"\r\n\r\n", 1)[1]
            if body:  # the body may come in a later packet than the head: its code is checked when it is there
                assert error_fields(json.loads(body))["code"] == "request_timeout", body
    assert statuses and all(status == 200 for status in statuses), statuses


@dataclass(frozen=True)
class Broken:
    raw: bytes
    status: int
    code: str


def chunked(body: bytes) -> bytes:
    return head(Content_Type="application/json", Transfer_Encoding="chunked") + body


#: Requests the HTTP server's own parser refuses, before or while the body is read.
BROKEN: dict[str, Broken] = {
    "negative chunk size": Broken(chunked(b"-5\r\nhello\r\n0\r\n\r\n"), 400, "malformed_http"),
    "chunk size not hex": Broken(chunked(b"zz\r\nhello\r\n0\r\n\r\n"), 400, "malformed_http"),
    "request line without a version": Broken(b"GARBAGE\r\n\r\n", 400, "malformed_http"),
    "method with a bad character": Broken(b"G(T /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed_http"),
    "unknown HTTP version": Broken(b"GET /v2/health/live HTTP/9.9\r\nHost: x\r\n\r\n", 400, "malformed_http"),
    "space in a header name": Broken(head("/v2/health/live", "GET", **{"Bad Header": "x"}), 400, "malformed_http"),
    "header line without a colon": Broken(
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n", 400, "malformed_http"
    ),
    "Content-Length and Transfer-Encoding": Broken(
        head(Content_Type="application/json", Content_Length="5", Transfer_Encoding="chunked") + b"0\r\n\r\n",
        400,
        "malformed_http",
    ),
    "two different Content-Lengths": Broken(
        b"POST /v1/models/echo:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        400,
        "malformed_http",
    ),
    "Content-Length not a number": Broken(head(Content_Length="abc"), 400, "malformed_http"),
    "unsupported Transfer-Encoding": Broken(head(Transfer_Encoding="gzip"), 400, "malformed_http"),
    "header field past --max-header-bytes": Broken(
        head("/v2/health/live", "GET", X_Big="a" * 9000), 431, "headers_too_large"
    ),
    "request line past --max-request-line": Broken(head("/v2/" + "a" * 9000, "GET"), 414, "uri_too_long"),
}


def answer(port: int, raw: bytes, first: bytes = b"") -> tuple[http.client.HTTPResponse, bytes, bool]:
    """Send `first` (a well-formed request, answered first) then `raw` on one connection: the answer to `raw`,
    its body, and whether the server closed the connection after it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5 * READ_TIMEOUT_S) as conn:
        if first:
            conn.sendall(first)
            earlier = http.client.HTTPResponse(conn)
            earlier.begin()
            assert earlier.status == 200
            earlier.read()
        conn.sendall(raw)
        response = http.client.HTTPResponse(conn)
        response.begin()
        body = response.read()
        try:
            closed = conn.recv(1) == b""
        except ConnectionResetError:
            closed = True
        return response, body, closed


def refused(server: Server) -> float:
    """The server's count of requests answered with an error (400 and up), whatever their route: the broken
    requests here are the only ones (docs/reference/metrics.md)."""
    return sum(
        value
        for (name, labels), value in scrape(server).items()
        if name == "twinserve_requests_total" and int(dict(labels)["code"]) >= 400
    )


def quiet_log(server: Server, since: int) -> str:
    """The server's log from offset `since` up to a marker request sent now: it holds what the requests before
    the marker logged (one worker process logs in order)."""
    marker = uuid.uuid4().hex  # server metadata: health checks are not logged
    assert HTTP.get(f"{server.url}/v2", headers={"X-Request-ID": marker}).status_code == 200
    server.wait_for_output(marker, timeout=10 * READ_TIMEOUT_S)
    return server.output()[since:]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(BROKEN))
def test_parser_refusal_gets_the_json_error_body(arch: str, name: str, well_behaved: dict[str, Server]) -> None:
    broken, server = BROKEN[name], well_behaved[arch]
    since = len(server.output())
    before = refused(server)
    response, body, closed = answer(server.port, broken.raw)
    assert response.status == broken.status, body[:300]
    assert response.getheader("content-type") == "application/json"
    error = error_fields(json.loads(body))
    assert error["code"] == broken.code and error["message"] and error["request_id"], error
    assert closed, "the connection stayed open after a request whose end the server could not know"
    # Counted once: by the server when no app saw it (a broken head: `twinserve_unparsed_requests_total` too), else
    # by the app whose body broke, as what it saw (400, or 499 once the server has closed the connection under it);
    # each process writes its sums within 50 ms.
    wait_until(lambda: refused(server) >= before + 1, 10, "the broken request counted")
    log = quiet_log(server, since)
    assert "Traceback" not in log and '"level":"error"' not in log, log[-2000:]
    assert refused(server) == before + 1, "counted twice"


@pytest.mark.parametrize("arch", ARCHS)
def test_malformed_request_after_a_good_one_on_the_same_connection(arch: str, well_behaved: dict[str, Server]) -> None:
    """A kept-alive connection whose second request is broken: that one gets the JSON 400 too."""
    response, body, closed = answer(
        well_behaved[arch].port, BROKEN["request line without a version"].raw, first=head("/v2/health/live", "GET")
    )
    assert response.status == 400 and error_fields(json.loads(body))["code"] == "malformed_http", body
    assert closed


@pytest.mark.parametrize("arch", ARCHS)
def test_a_broken_chunk_the_app_never_reads_gets_one_answer(arch: str, well_behaved: dict[str, Server]) -> None:
    """No route reads the body: the answer is the parser's (every server parses the body as it arrives, before the
    app runs), never a second one, and the connection closes, since where the next request would start is unknown."""
    raw = head("/nowhere", Transfer_Encoding="chunked") + b"-5\r\nhello\r\n0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", well_behaved[arch].port), timeout=5 * READ_TIMEOUT_S) as conn:
        conn.sendall(raw)
        received = b""
        try:
            while data := conn.recv(65536):
                received += data
        except ConnectionResetError:
            pass
    response_head, _, body = received.partition(b"\r\n\r\n")
    assert response_head.split(b" ", 2)[1] == b"400", received[:300]
    error = error_fields(json.loads(body))  # one JSON document, nothing after it
    assert error["code"] == "malformed_http", error


PIPELINED = 400


@pytest.mark.parametrize("arch", ARCHS)
def test_hundreds_of_pipelined_requests_are_answered_in_order(arch: str, well_behaved: dict[str, Server]) -> None:
    """RFC 9112 9.3.2: a server answers pipelined requests in the order it received them. Hundreds in one write, a
    client flooding one connection, are answered one after another, and the server serves on."""
    ids = [f"pipelined-{i:04d}" for i in range(PIPELINED)]
    raw = b"".join(head("/v2/health/live", "GET", X_Request_ID=request_id) for request_id in ids)
    answered: list[str] = []
    with (
        socket.create_connection(("127.0.0.1", well_behaved[arch].port), timeout=5 * READ_TIMEOUT_S) as conn,
        conn.makefile("rb") as stream,  # one buffer for every answer: each may arrive in the same read
    ):
        conn.sendall(raw)
        for _ in ids:
            status = stream.readline().split(b" ", 2)[1]
            fields = dict(line.decode().lower().split(": ", 1) for line in iter(stream.readline, b"\r\n"))
            body = stream.read(int(fields["content-length"]))
            assert status == b"200" and json.loads(body) == {"live": True}
            answered.append(fields["x-request-id"].strip())
    assert answered == ids
    assert HTTP.get(well_behaved[arch].url + "/v2/health/live").status_code == 200


@pytest.mark.parametrize("arch", ARCHS)
def test_requests_pipelined_before_a_broken_one_are_answered_then_its_400(
    arch: str, well_behaved: dict[str, Server]
) -> None:
    """RFC 9112 9.3.2: the requests read whole before a broken one are answered, in order, then the broken one gets
    its 400 and the connection closes (nothing after it can be framed). Nothing read whole is lost, in every
    architecture: sync answered only the first, with `Connection: close`, and dropped the rest."""
    server = well_behaved[arch]
    before = refused(server)
    ids = [f"before-the-broken-{i}" for i in range(3)]
    raw = b"".join(head("/v2/health/live", "GET", X_Request_ID=request_id) for request_id in ids)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5 * READ_TIMEOUT_S) as conn,
        conn.makefile("rb") as stream,
    ):
        conn.sendall(raw + BROKEN["request line without a version"].raw)
        answers = []
        for _ in range(len(ids) + 1):
            status = int(stream.readline().split(b" ", 2)[1])
            fields = dict(line.decode().lower().split(": ", 1) for line in iter(stream.readline, b"\r\n"))
            answers.append((status, fields, json.loads(stream.read(int(fields["content-length"])))))
        assert stream.read() == b""  # then closed
    assert [(status, fields["x-request-id"].strip(), body) for status, fields, body in answers[:-1]] == [
        (200, request_id, {"live": True}) for request_id in ids
    ]
    assert all(fields.get("connection", "keep-alive").strip() != "close" for _, fields, _ in answers[:-1])
    status, fields, body = answers[-1]
    assert (status, error_fields(body)["code"], fields["connection"].strip()) == (400, "malformed_http", "close")
    wait_until(lambda: refused(server) >= before + 1, 10, "the broken request counted")
    assert refused(server) == before + 1, "counted twice"


@pytest.mark.parametrize("arch", ARCHS)
def test_a_silent_connection_is_closed_at_the_read_timeout(arch: str, well_behaved: dict[str, Server]) -> None:
    with socket.create_connection(("127.0.0.1", well_behaved[arch].port), timeout=5 * READ_TIMEOUT_S) as conn:
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(1024) == b""  # closed, without an answer: there is no request to answer
        waited = time.monotonic() - started
    assert READ_TIMEOUT_S * 0.9 <= waited <= 2 * READ_TIMEOUT_S  # its deadline, not gthread's 5 s wait + keep-alive
