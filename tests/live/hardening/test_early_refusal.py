"""A full queue's refusal: with a model's queue full, a predict request is answered 503 `queue_full` before its body is
read and the model never begins it, in every architecture; in sync the worker's poller answers it from the head
(fronts/early.py), the app's answer byte for byte, and no thread runs it.

The queue is held full deterministically: the Gate model blocks in predict until the test releases it, one batch
of one instance computes at a time, and the queue holds 2 instances, of which priority 2 (the default here) may
fill 1 and priority 1 both. No timings: every step waits on a condition. In the sync architecture twinserve's
gunicorn worker refuses before Flask (the batch queue here; the request threads' backlog too).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ARCHS
from tests.serving import HTTP, Server, SharedServers, model_path, sample, scrape, wait_for_new_output, wait_until

GATE, ECHO, DRIP = model_path("Gate"), model_path("Echo"), model_path("Drip")
#: 4 request threads (sync): 3 held by `_held`'s requests leave 1 for everything else, and a held stream takes the
#: last (test_a_kept_alive_connection_is_refused_while_every_request_thread_is_busy). A read deadline of 1 s, so
#: that a connection whose body never comes is closed within the test (every request here sends its whole body).
FLAGS = ["--workers", "1", "--threads", "4", "--model-workers", "1", "--max-batch-size", "2", "--read-timeout-s", "1"]
FLAGS += ["--max-queue", "2", "--max-queue-wait-ms", "0", "--priority-levels", "2", "--default-priority", "2"]

TIMEOUT_S = 60.0
#: A liveness probe, raw: the request that makes a connection kept alive before the test's own.
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _queued(server: Server) -> int:
    serving = HTTP.get(f"{server.url}/v1/models/gate", timeout=TIMEOUT_S).json()["serving"]
    return int(serving["queued_instances"])


def _early(server: Server) -> float:
    return sample(scrape(server), "twinserve_early_refusals_total", model="gate")


def _made_early(server: Server, refusals: int) -> int:
    """How many of `refusals` the server makes before the app: each, in sync (its poller, from the head); none
    under uvicorn (async, hybrid), whose app refuses each with the same answer before it reads the body."""
    return refusals if server.arch == "sync" else 0


def _body(gate: Path, v2: bool = False) -> bytes:
    instance = {"gate": str(gate)}
    if v2:
        data = json.dumps(instance)
        return json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [data]}]}).encode()
    return json.dumps({"instances": [instance]}).encode()


def _raw(sock: socket.socket, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send `request` on `sock` and read one response: status line, headers (lower-cased names), body."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response head: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status, *lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode() for k, v in (line.split(b": ", 1) for line in lines)}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        rest += chunk
    assert len(rest) == length, "more bytes than one response"
    return status, headers, rest


def _post(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *extra]
    return ("\r\n".join(lines) + f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


@contextmanager
def _held(server: Server, tmp: Path) -> Iterator[dict[str, Path]]:
    """The Gate model computing `a` (priority 2) with `b` (priority 2) and `d` (priority 1) queued behind it:
    the queue holds 2 of 2 instances. Everything is released, and every held request answered 200, on exit."""
    gates = {name: tmp / name for name in "abcdefgh"}
    answers: dict[str, int] = {}

    def send(name: str, priority: str | None) -> None:
        headers = {"Content-Type": "application/json", **({"X-Priority": priority} if priority else {})}
        url = f"{server.url}/v1/models/gate:predict"
        answers[name] = HTTP.post(url, content=_body(gates[name]), headers=headers, timeout=TIMEOUT_S).status_code

    threads = [threading.Thread(target=send, args=("a", None))]
    threads[0].start()
    wait_until(gates["a"].with_suffix(".started").exists, TIMEOUT_S, "a computing")
    for name, priority, queued in (("b", None, 1), ("d", "1", 2)):
        thread = threading.Thread(target=send, args=(name, priority))
        thread.start()
        threads.append(thread)
        wait_until(lambda: _queued(server) == queued, TIMEOUT_S, f"{queued} queued")  # noqa: B023 (waited on here)
    try:
        yield gates
    finally:
        for gate in gates.values():
            gate.with_suffix(".release").touch()
        for thread in threads:
            thread.join(TIMEOUT_S)
    assert answers == {"a": 200, "b": 200, "d": 200}


@pytest.fixture(scope="module", params=ARCHS)
def gated(request: pytest.FixtureRequest) -> Iterator[Server]:
    """One server per architecture for the tests on FLAGS: each leaves the queue empty and every request thread
    free (every gate released, every request answered) and counts from what it found."""
    with Server([GATE, ECHO, DRIP], request.param, *FLAGS) as server:
        yield server


@pytest.mark.hardening
def test_a_full_queue_is_answered_before_the_app_with_its_own_503(gated: Server, tmp_path: Path) -> None:
    server = gated
    with _held(server, tmp_path) as gates:
        before = _early(server)
        with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as sock:
            # Priority 2 past its share (1 of 2): refused early, on a kept-alive connection.
            status, headers, body = _raw(sock, _post("/v1/models/gate:predict", _body(gates["c"])))
            assert status.split()[1] == b"503"
            assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
            assert headers.get("connection", "keep-alive") == "keep-alive"  # the body is discarded, not the connection
            error = json.loads(body)
            assert error["code"] == "queue_full" and error["request_id"] == headers["x-request-id"]
            assert "priority 2" in error["error"]
            # The same connection serves what comes next: a probe, another model, the V2 route.
            status, _, body = _raw(sock, LIVE)
            assert status.split()[1] == b"200" and json.loads(body) == {"live": True}
            echo = json.dumps({"instances": [1, 2]}).encode()
            status, _, body = _raw(sock, _post("/v1/models/echo:predict", echo))
            assert status.split()[1] == b"200" and json.loads(body) == {"predictions": [1, 2]}
            status, _, body = _raw(sock, _post("/v2/models/gate/infer", _body(gates["e"], v2=True)))
            assert status.split()[1] == b"503" and set(json.loads(body)) == {"error"}
            # Priority 1 may fill the whole queue, which is full now too.
            status, _, _ = _raw(sock, _post("/v1/models/gate:predict", _body(gates["f"]), "X-Priority: 1"))
            assert status.split()[1] == b"503"
        assert _early(server) == before + _made_early(server, 3)
        # A bad X-Priority is the app's to answer (400), not refused early.
        bad = HTTP.post(
            f"{server.url}/v1/models/gate:predict",
            content=_body(gates["g"]),
            headers={"Content-Type": "application/json", "X-Priority": "9"},
            timeout=TIMEOUT_S,
        )
        assert bad.status_code == 400 and _early(server) == before + _made_early(server, 3)
    for name in "cefg":  # the model never began the refused requests
        assert not gates[name].with_suffix(".started").exists(), name


@pytest.mark.hardening
def test_a_higher_priority_is_admitted_while_a_lower_one_is_refused_early(gated: Server, tmp_path: Path) -> None:
    gates = {name: tmp_path / name for name in "abc"}
    codes: dict[str, Any] = {}
    server = gated

    def send(name: str, priority: str | None) -> None:
        headers = {"Content-Type": "application/json", **({"X-Priority": priority} if priority else {})}
        url = f"{server.url}/v1/models/gate:predict"
        codes[name] = HTTP.post(url, content=_body(gates[name]), headers=headers, timeout=TIMEOUT_S).status_code

    threads = [threading.Thread(target=send, args=("a", None))]
    threads[0].start()
    try:  # the server is shared: its gates are released and its requests answered whatever happens here
        wait_until(gates["a"].with_suffix(".started").exists, TIMEOUT_S, "a computing")
        threads.append(threading.Thread(target=send, args=("b", None)))
        threads[-1].start()
        wait_until(lambda: _queued(server) == 1, TIMEOUT_S, "b queued")
        before = _early(server)
        send("c", None)  # priority 2: its share is full
        assert codes["c"] == 503 and _early(server) == before + _made_early(server, 1)
        threads.append(threading.Thread(target=send, args=("c", "1")))  # priority 1: into the rest of the queue
        threads[-1].start()
        wait_until(lambda: _queued(server) == 2, TIMEOUT_S, "the priority-1 request queued")
    finally:
        for gate in gates.values():
            gate.with_suffix(".release").touch()
        for thread in threads:
            thread.join(TIMEOUT_S)
    assert codes == {"a": 200, "b": 200, "c": 200}
    assert _early(server) == before + _made_early(server, 1)


@pytest.mark.hardening
def test_the_early_answer_is_the_apps_answer_byte_for_byte(gated: Server, tmp_path: Path) -> None:
    """A chunked body is the app's to refuse (fronts/early.py): the same request, once chunked, once not, and once
    more on a kept-alive connection (sync: refused by the worker's poller rather than a request thread)."""
    server = gated
    rejected = {"model": "gate", "reason": "queue_full"}
    answered = {"model": "gate", "endpoint": "predict", "code": "503"}
    counted = scrape(server)
    with _held(server, tmp_path) as gates:
        body = _body(gates["c"])
        plain = _post("/v1/models/gate:predict", body, "X-Request-ID: same-id", "Connection: close")
        head = plain.split(b"\r\nContent-Length:")[0]
        chunked = head + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        before = _early(server)
        answers = []
        for request, kept in ((plain, False), (chunked, False), (plain, True)):
            with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as sock:
                if kept:
                    status, _, _ = _raw(sock, LIVE)
                    assert status.split()[1] == b"200"
                sock.sendall(request)
                data = b""
                while chunk := sock.recv(65536):  # Connection: close: the server closes after its answer
                    data += chunk
            lines = [line for line in data.split(b"\r\n") if not line.lower().startswith(b"date: ")]
            answers.append(b"\r\n".join(lines))
        # sync: the first and the third refused early, the second (chunked) by the app; async, hybrid: all by the app
        assert _early(server) == before + _made_early(server, 2)
        assert answers[0] == answers[1] == answers[2]
        assert answers[0].startswith(b"HTTP/1.1 503 ") and b"connection: close" in answers[0].lower()
        samples = scrape(server)
        for name, labels in (("twinserve_rejected_requests_total", rejected), ("twinserve_requests_total", answered)):
            assert sample(samples, name, **labels) - sample(counted, name, **labels) == 3, name
    assert not gates["c"].with_suffix(".started").exists()


@pytest.mark.hardening
def test_a_refused_request_whose_body_never_comes_does_not_hold_its_connection(gated: Server, tmp_path: Path) -> None:
    head = _post("/v1/models/gate:predict", b"").replace(b"Content-Length: 0", b"Content-Length: 100")
    server = gated
    with (
        _held(server, tmp_path),
        socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as sock,
    ):
        status, _, _ = _raw(sock, head)  # answered from the head; the body is never sent
        assert status.split()[1] == b"503"
        assert sock.recv(1) == b""  # closed by the server (read deadline, or keep-alive timeout), not held


@pytest.mark.hardening
def test_a_kept_alive_connection_is_refused_while_every_request_thread_is_busy(gated: Server, tmp_path: Path) -> None:
    """A refusal needs no request thread: in sync, the worker's poller refuses a kept-alive connection's request
    from its head (servers/sync/admission.py). Every one of the 4 request threads is held (the 3 gated
    requests, and a stream gated before its first step), so a refusal left to a thread would not come until the
    test released them; it comes at once, on a kept-alive connection and on a new one, and the kept-alive
    connection serves on afterwards."""
    drip_dir = tmp_path / "drip"
    drip_dir.mkdir()
    server = gated
    counted = scrape(server)  # before any thread is held (sync has none for /metrics meanwhile)
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as sock:
        status, _, _ = _raw(sock, LIVE)  # kept alive
        assert status.split()[1] == b"200"
        with _held(server, tmp_path) as gates:
            stream = threading.Thread(target=_stream_held_drip, args=(server, drip_dir))
            stream.start()
            try:
                wait_until((drip_dir / "waiting").exists, TIMEOUT_S, "the stream holding its thread")
                before = _early(server) if server.arch != "sync" else None  # sync: no thread free for /metrics
                status, headers, body = _raw(sock, _post("/v1/models/gate:predict", _body(gates["c"])))
                assert status.split()[1] == b"503" and headers["retry-after"] == "1"
                assert headers.get("connection", "keep-alive") == "keep-alive"
                assert json.loads(body)["code"] == "queue_full"
                # A new connection too: accepted while crowded, it waits in the poller, not for a thread.
                with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as fresh:
                    status, _, _ = _raw(fresh, _post("/v2/models/gate/infer", _body(gates["e"], v2=True)))
                    assert status.split()[1] == b"503"
                if before is not None:
                    assert _early(server) == before + _made_early(server, 2)
            finally:
                (drip_dir / "release").touch()
                stream.join(TIMEOUT_S)
        # Released (every gate, "h" included): the same connection is served by a thread again.
        status, _, body = _raw(sock, _post("/v1/models/gate:predict", _body(gates["h"])))
        assert status.split()[1] == b"200" and json.loads(body) == {"predictions": ["released"]}
    full = {"model": "gate", "reason": "queue_full"}
    rejected = sample(scrape(server), "twinserve_rejected_requests_total", **full)
    assert rejected - sample(counted, "twinserve_rejected_requests_total", **full) == 2  # this test's two
    assert not gates["c"].with_suffix(".started").exists() and not gates["e"].with_suffix(".started").exists()


def _stream_held_drip(server: Server, directory: Path) -> None:
    """One `Drip` stream, held before its first step until `directory/release` exists."""
    body = {"instances": [{"dir": str(directory), "steps": 1, "gate_at": 0}]}
    with HTTP.stream("POST", f"{server.url}/v1/models/drip:stream", json=body, timeout=TIMEOUT_S) as response:
        assert response.status_code == 200
        response.read()


#: Sync, one request thread, a backlog of 1 past which a request is held (not refused) for --max-queue-wait-ms.
HOLD_FLAGS = ["--workers", "1", "--threads", "1", "--max-queue", "1", "--priority-levels", "1"]


@contextmanager
def _one_thread_computing(
    server: Server, gates: dict[str, Path]
) -> Iterator[tuple[list[socket.socket], threading.Thread]]:
    """Sync with one request thread: three kept-alive connections idle in the poller, and the thread computing
    the request for `gates["a"]` (its client's thread, which ends once it is released, is yielded beside them).
    On exit every gate is released and the connections closed: the server may be shared, and is left idle."""
    socks: list[socket.socket] = []
    gate = gates["a"]
    first: threading.Thread | None = None
    try:
        # One at a time, each kept alive and idle in the poller, its first request answered: a connection opened
        # and left silent would be closed at the read timeout before its turn came.
        for _ in range(3):
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S))
            assert _raw(socks[-1], LIVE)[0].split()[1] == b"200"
        url = f"{server.url}/v1/models/gate:predict"
        first = threading.Thread(target=lambda: HTTP.post(url, content=_body(gate), timeout=TIMEOUT_S))
        first.start()
        wait_until(gate.with_suffix(".started").exists, TIMEOUT_S, "a computing")
        yield socks, first
    finally:
        for each in gates.values():
            each.with_suffix(".release").touch()
        if first is not None:
            first.join(TIMEOUT_S)
        for sock in socks:
            sock.close()


@pytest.mark.hardening
@pytest.mark.parametrize(("wait_ms", "answer"), [("60000", 200), ("0.001", 503)])
def test_a_request_past_the_backlog_is_held_unread_then_served_or_refused_at_its_wait(
    wait_ms: str, answer: int, shared_servers: SharedServers, tmp_path: Path
) -> None:
    """Sync: a request arriving while more requests wait for a thread than `--max-queue` allows is not refused at
    once (a closed-loop client would come straight back); the worker's poller holds it, read but handed to no
    thread (servers/sync/admission.py). Held within its wait, it is served once the backlog lets it in (200); held
    past it, it is refused from the poller (503 `queue_full`), while the one thread is still busy.

    The thread computes `a`; `b`, sent on a kept-alive connection, waits for it in the threads' queue (one request
    per thread waits there); `c` and `d`, sent on two more, are held. The poller takes readable connections in the
    order their bytes arrived (epoll's ready list). Held past its wait (a microsecond), `c` has one request ahead
    of it, within `--max-queue 1`, and is let in; `d` has two, and is refused."""
    gates = {name: tmp_path / name for name in "abcd"}
    server = shared_servers.get([GATE], "sync", *HOLD_FLAGS, "--max-queue-wait-ms", wait_ms)
    with _one_thread_computing(server, gates) as (socks, first):
        for sock, name in zip(socks, "bcd", strict=True):
            sock.sendall(_post("/v1/models/gate:predict", _body(gates[name])))
        if answer == 503:  # refused at its wait, from the poller: the thread is still computing a
            status, headers, body = _raw(socks[2], b"")
            assert status.split()[1] == b"503" and headers["retry-after"] == "1"
            assert json.loads(body)["code"] == "queue_full"
        for gate in gates.values():
            gate.with_suffix(".release").touch()
        first.join(TIMEOUT_S)
        statuses = [_raw(sock, b"")[0].split()[1] for sock in (socks if answer == 200 else socks[:2])]
        assert statuses == [b"200"] * len(statuses)
        if answer == 200:
            assert gates["d"].with_suffix(".started").exists()  # held, then computed
        else:
            assert not gates["d"].with_suffix(".started").exists()  # never computed


def _computed_in_order(
    server: Server,
    gates: dict[str, Path],
    socks: list[socket.socket],
    first: threading.Thread,
    levels: tuple[str, str, str],
    said: str,
    order: str,
) -> None:
    """With `a` computing in the one thread: send `b`, `c` and `d` at `levels` on the three kept-alive `socks`,
    wait for the poller to say `said` (debug level), then release each gate in turn: `b`, `c` and `d` start in
    `order`, and every request is answered 200."""
    said_before = len(server.output())  # the server may be shared: only what it says from here on counts
    for sock, name, level in zip(socks, "bcd", levels, strict=True):
        sock.sendall(_post("/v1/models/gate:predict", _body(gates[name]), f"X-Priority: {level}"))
    wait_for_new_output(server, said_before, said, TIMEOUT_S)
    started = ["a"]
    for expected in order:
        gates[started[-1]].with_suffix(".release").touch()
        wait_until(gates[expected].with_suffix(".started").exists, TIMEOUT_S, f"{expected} computing")
        assert [n for n in "bcd" if gates[n].with_suffix(".started").exists()] == sorted([*started[1:], expected])
        started.append(expected)
    gates[order[-1]].with_suffix(".release").touch()
    first.join(TIMEOUT_S)
    assert [_raw(sock, b"")[0].split()[1] for sock in socks] == [b"200"] * 3


#: Sync, one request thread, two priority levels, a backlog far within --max-queue, held requests never let in at
#: their wait within a test: the order in which the threads take requests up, level by level.
ORDER_FLAGS = ["--workers", "1", "--threads", "1", "--max-queue", "16", "--priority-levels", "2"]
ORDER_FLAGS += ["--log-level", "debug", "--max-queue-wait-ms", "60000"]


@pytest.mark.hardening
def test_a_later_high_priority_request_reaches_the_thread_before_an_earlier_low_one(
    shared_servers: SharedServers, tmp_path: Path
) -> None:
    """Sync: the request threads take the highest level waiting next (servers/sync/threads.py), so a
    request at level 1 sent after one at level 2 is computed first, though the backlog is far within
    `--max-queue` and no request is refused (issue #16: under overload the highest level keeps its latency). The
    poller hands it to the threads at once: only requests at lower levels wait there.

    The thread computes `a`; `b` (level 2) waits for a thread; `c` (level 2) is held, a thread's worth of its level
    waiting already; `d` (level 1) goes to the threads ahead of `b` (the poller says so at debug level). Each gate is
    released in turn, and which request starts next is read from the gates' files: `d`, `b`, `c`."""
    gates = {name: tmp_path / name for name in "abcd"}
    server = shared_servers.get([GATE], "sync", *ORDER_FLAGS)
    with _one_thread_computing(server, gates) as (socks, first):
        said = "a request at priority 1 goes to the threads ahead of 1 at lower levels"
        _computed_in_order(server, gates, socks, first, ("2", "2", "1"), said, "dbc")


@pytest.mark.hardening
def test_held_requests_reach_the_thread_highest_level_first(shared_servers: SharedServers, tmp_path: Path) -> None:
    """Sync: requests held in the poller, a thread's worth of their level or above waiting already, are handed to
    the threads as they free up, the highest level first (servers/sync/admission.py).

    The thread computes `a`; `b` (level 1) waits for a thread; `c` (level 2) and then `d` (level 1) are held (the
    poller says so at debug level). Each gate is released in turn: `b`, then `d`, then `c` start."""
    gates = {name: tmp_path / name for name in "abcd"}
    server = shared_servers.get([GATE], "sync", *ORDER_FLAGS)
    with _one_thread_computing(server, gates) as (socks, first):
        _computed_in_order(server, gates, socks, first, ("1", "2", "1"), "priority 1 for a thread (2 held)", "bdc")


@pytest.mark.hardening
def test_a_low_priority_request_let_in_at_its_wait_is_computed_after_a_higher_level_held(tmp_path: Path) -> None:
    """Sync: a request held for its level's whole wait and then let in (the requests ahead of it are within its
    level's count) is next at its level, behind every higher level held; it does not go to the threads ahead of
    them (servers/sync/admission.py `_expired`).

    The thread computes `a`; `b` (level 1) waits for a thread; `c` (level 10, a wait of 3 s: a tenth of
    `--max-queue-wait-ms`) and `d` (level 1, 30 s) are held. Once `c` is let in at its wait (the poller says so at
    debug level), each gate is released in turn: `d` is computed before `c`, and every request is answered 200."""
    gates = {name: tmp_path / name for name in "abcd"}
    flags = ["--workers", "1", "--threads", "1", "--max-queue", "40", "--priority-levels", "10"]
    with (
        Server([GATE], "sync", *flags, "--max-queue-wait-ms", "30000", "--log-level", "debug") as server,
        _one_thread_computing(server, gates) as (socks, first),
    ):
        _computed_in_order(server, gates, socks, first, ("1", "10", "1"), "priority 10 at its wait", "bdc")


@pytest.mark.hardening
def test_a_connection_its_client_closes_while_crowded_is_closed_by_the_poller_and_joins_no_backlog(
    shared_servers: SharedServers, tmp_path: Path
) -> None:
    """Sync: while the request threads' backlog is past its bound, a kept-alive connection whose client closes it
    is closed by the worker's poller (servers/sync/worker.py), with every thread still busy. Handed to a thread (as
    gunicorn's gthread did), it would only be closed once a thread is free, and until then it would count in the
    backlog that the requests ahead of it are admitted by: with a bound of 1, `b` would be refused for it (503 "2
    requests are waiting") though only `c` waits behind it."""
    gates = {name: tmp_path / name for name in "abc"}
    server = shared_servers.get([GATE], "sync", *HOLD_FLAGS, "--max-queue-wait-ms", "60000")
    with _one_thread_computing(server, gates) as (socks, first):
        for sock, name in zip(socks, "bc", strict=False):  # both wait for the one thread: `b` queued, `c` held
            sock.sendall(_post("/v1/models/gate:predict", _body(gates[name])))
        leaving = socks[2]
        leaving.shutdown(socket.SHUT_WR)  # the client is done: its end of file, after `b` and `c` (epoll's order)
        assert leaving.recv(1) == b""  # closed by the server while the one thread still computes `a`
        for gate in gates.values():
            gate.with_suffix(".release").touch()
        first.join(TIMEOUT_S)
        statuses = [_raw(sock, b"")[0].split()[1] for sock in socks[:2]]
        assert statuses == [b"200", b"200"]


@pytest.mark.hardening
def test_a_connection_its_client_closes_is_closed_by_the_poller_though_the_server_is_not_crowded(
    tmp_path: Path,
) -> None:
    """Sync: a kept-alive connection whose client closes it is closed by the worker's poller even while nothing
    waits for a thread (servers/sync/worker.py). Handed to the one thread, busy with `a`, it would wait in the
    backlog until `a` ended, and `b`, sent meanwhile within `--max-queue 1`, would be refused for it: 503, with
    no request ahead (a CI run saw this: clients that had their answers closed their connections just before the
    next request came)."""
    gates = {name: tmp_path / name for name in "ab"}
    with (
        Server([GATE], "sync", *HOLD_FLAGS, "--max-queue-wait-ms", "0") as server,
        _one_thread_computing(server, gates) as (socks, first),
    ):
        leaving = socks[0]
        leaving.shutdown(socket.SHUT_WR)  # the client is done
        assert leaving.recv(1) == b""  # closed by the server while the one thread still computes `a`
        socks[1].sendall(_post("/v1/models/gate:predict", _body(gates["b"])))
        for gate in gates.values():
            gate.with_suffix(".release").touch()
        first.join(TIMEOUT_S)
        status, _, body = _raw(socks[1], b"")
        assert status.split()[1] == b"200" and json.loads(body) == {"predictions": ["released"]}
