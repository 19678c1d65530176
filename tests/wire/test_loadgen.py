"""The load generator against a real HTTP/1.1 server on loopback: counting, errors, framing, open loop, CO."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import re
import statistics
import threading
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tests.serving import free_port
from twinserve.lab.loadgen import LevelResult, LoadSpec, run_level, run_level_sync
from twinserve.lab.loadgen.http import ResponseParser
from twinserve.lab.loadgen.run import arrival_times

BODY = b'{"instances": [[5.1, 3.5, 1.4, 0.2]]}'
SLOW_S = 0.1


class LabServer:
    """A raw asyncio HTTP/1.1 server in a background thread; the path picks the behaviour.

    /ok answers 200; /flaky 500 every other request; /chunked a chunked 200; /close 200 then closes;
    /drop closes without answering; /slow answers 200 after SLOW_S; /eof an HTTP/1.0 200 whose body runs to the
    connection's end; /split a 200 in three writes; /continue a 100 Continue, then a 200; /busy 503, 503, 200
    in turn (over every connection), with a Retry-After the retrying client ignores.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.writers: set[asyncio.StreamWriter] = set()
        self.flaky = itertools.count()
        self.busy = itertools.count()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
                assert length is not None
                await reader.readexactly(int(length.group(1)))
                if not await self.respond(head.split(b" ", 2)[1], writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.writers.discard(writer)

    async def respond(self, path: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False to close the connection."""
        answer = b'{"predictions":[0]}'
        fixed = b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(answer)
        if path == b"/drop":
            return False
        if path == b"/slow":
            await asyncio.sleep(SLOW_S)
        if path == b"/eof":
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + answer)
            await writer.drain()
            return False
        if path in (b"/split", b"/continue"):
            whole = b"HTTP/1.1 200 OK\r\n" + fixed + b"\r\n" + answer
            parts = (
                [whole[:20], whole[20:-5], whole[-5:]]
                if path == b"/split"
                else [b"HTTP/1.1 100 Continue\r\n\r\n", whole]
            )
            for part in parts:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.002)  # separate segments, separate reads
            return True
        if path == b"/busy" and next(self.busy) % 3 != 2:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\n" + fixed + b"\r\n" + answer)
        elif path == b"/flaky" and next(self.flaky) % 2:
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\n" + fixed + b"\r\n" + answer)
        elif path == b"/chunked":
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (answer[:5], answer[5:]))
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-T: 1\r\n\r\n")
        elif path == b"/close":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n" + fixed + b"\r\n" + answer)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\n" + fixed + b"\r\n" + answer)
        await writer.drain()
        return path != b"/close"

    async def shutdown(self) -> None:
        self.server.close()
        for writer in list(self.writers):
            writer.close()
        await self.server.wait_closed()
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def lab_server() -> Iterator[LabServer]:
    server = LabServer()
    yield server
    server.stop()


def closed(url: str, concurrency: int = 4, duration_s: float = 0.5, timeout_s: float = 30.0) -> LevelResult:
    return run_level_sync(LoadSpec(url, [BODY], duration_s=duration_s, concurrency=concurrency, timeout_s=timeout_s))


def assert_adds_up(result: LevelResult) -> None:
    errors = sum(result.http_errors.values()) + sum(result.transport_errors.values())
    assert result.sent == result.ok + errors
    json.dumps(result.to_dict())


def test_closed_loop_counts_add_up(lab_server: LabServer) -> None:
    bodies = [BODY, b'{"instances": [[6.0, 2.2, 5.0, 1.5]]}']
    result = run_level_sync(LoadSpec(lab_server.url + "/ok", bodies, duration_s=0.5, warmup_s=0.2, concurrency=4))
    assert_adds_up(result)
    assert result.ok == result.sent > 0
    assert result.http_errors == {} and sum(result.transport_errors.values()) == 0
    assert result.mode == "closed" and result.achieved_rate is None and result.connections_used == 4
    assert result.throughput_rps == pytest.approx(result.ok / 0.5)
    p50, p99, top = (result.latency_ms[key] for key in ("p50", "p99", "max"))
    assert p50 is not None and p99 is not None and top is not None
    assert 0 < p50 <= p99 <= top


def test_http_errors_are_counted_by_status(lab_server: LabServer) -> None:
    spec = LoadSpec(lab_server.url + "/flaky", [BODY], duration_s=0.5, concurrency=2)
    result = asyncio.run(run_level(spec))  # the plain asyncio loop, not uvloop
    assert_adds_up(result)
    assert set(result.http_errors) == {"500"}
    assert result.http_errors["500"] > 0 and result.ok > 0
    assert abs(result.http_errors["500"] - result.ok) <= 2


def test_refused_requests_are_retried_at_once_up_to_the_limit(lab_server: LabServer) -> None:
    lab_server.busy = itertools.count()
    spec = LoadSpec(lab_server.url + "/busy", [BODY], duration_s=0.3, concurrency=1, retries=2)
    result = run_level_sync(spec)  # one connection: each request meets 503, 503, then 200
    assert_adds_up(result)
    assert result.ok == result.sent > 0 and result.http_errors == {}
    assert result.retries == 2 * result.sent
    lab_server.busy = itertools.count()
    once = run_level_sync(dataclasses.replace(spec, retries=1))  # 503, 503 | 200 | 503, 503 | 200 ...
    assert_adds_up(once)
    assert once.retries == once.http_errors["503"] > 0 and abs(once.ok - once.retries) <= 1


def test_other_errors_are_not_retried(lab_server: LabServer) -> None:
    result = run_level_sync(LoadSpec(lab_server.url + "/flaky", [BODY], duration_s=0.3, concurrency=2, retries=3))
    assert result.http_errors["500"] > 0 and result.retries == 0


def test_chunked_responses_are_read_whole(lab_server: LabServer) -> None:
    result = closed(lab_server.url + "/chunked")
    assert_adds_up(result)
    assert result.ok == result.sent > 0


@pytest.mark.parametrize("path", ["/eof", "/split", "/continue"])
def test_responses_are_framed_however_they_arrive(lab_server: LabServer, path: str) -> None:
    result = closed(lab_server.url + path, concurrency=2, duration_s=0.3)
    assert_adds_up(result)
    assert result.ok == result.sent > 0


def test_connection_close_reconnects(lab_server: LabServer) -> None:
    result = closed(lab_server.url + "/close")
    assert_adds_up(result)
    assert result.ok == result.sent > 0


def test_dropped_connections_are_transport_errors(lab_server: LabServer) -> None:
    result = closed(lab_server.url + "/drop", concurrency=2, duration_s=0.3)
    assert_adds_up(result)
    assert result.ok == 0 and result.transport_errors["reset"] == result.sent > 0


def test_refused_port_is_a_transport_error() -> None:
    result = closed(f"http://127.0.0.1:{free_port()}/ok", concurrency=2, duration_s=0.3)
    assert_adds_up(result)
    assert result.ok == 0 and result.transport_errors["connect_refused"] == result.sent > 0
    assert result.latency_ms["p50"] is None


def test_timeouts_are_transport_errors(lab_server: LabServer) -> None:
    result = closed(lab_server.url + "/slow", concurrency=2, duration_s=0.3, timeout_s=SLOW_S / 4)
    assert_adds_up(result)
    assert result.ok == 0 and result.transport_errors["timeout"] == result.sent > 0


def test_a_deadline_outlived_by_the_connection_does_not_cut_the_next_request(lab_server: LabServer) -> None:
    # Each request takes SLOW_S of a 1.8 * SLOW_S deadline, so the timer set for one request's deadline fires while
    # the next is in flight and not yet due: it must wait on, not time that one out.
    result = closed(lab_server.url + "/slow", concurrency=2, duration_s=3.5 * SLOW_S, timeout_s=1.8 * SLOW_S)
    assert_adds_up(result)
    assert result.ok == result.sent >= 6
    service = result.service_time_ms["p50"]
    assert service is not None and service >= SLOW_S * 1000  # arrival times are never read early


@pytest.mark.parametrize("arrivals", ["poisson", "constant"])
def test_open_loop_keeps_roughly_to_its_rate(lab_server: LabServer, arrivals: Literal["poisson", "constant"]) -> None:
    rate, seconds = 200.0, 1.5
    spec = LoadSpec(lab_server.url + "/ok", [BODY], duration_s=seconds, warmup_s=0.2, rate=rate, arrivals=arrivals)
    result = run_level_sync(spec)
    assert_adds_up(result)
    assert result.mode == "open" and result.ok == result.sent
    assert 0.5 * rate * seconds <= result.sent <= 1.5 * rate * seconds
    assert result.achieved_rate is not None and 0.5 * rate <= result.achieved_rate <= 1.5 * rate
    assert 1 <= result.connections_used <= spec.max_connections and not result.pool_exhausted


def test_latency_counts_from_the_intended_send_time(lab_server: LabServer) -> None:
    # The server takes SLOW_S a request over one connection, a third of what 30/s asks: the backlog must show.
    spec = LoadSpec(lab_server.url + "/slow", [BODY], duration_s=1.0, rate=30, max_connections=1, timeout_s=10)
    result = run_level_sync(spec)
    assert_adds_up(result)
    assert result.ok == result.sent > 0
    assert result.pool_exhausted and result.connections_used == 1 and not result.generator_limited
    latency, service = result.latency_ms["p99"], result.service_time_ms["p99"]
    assert latency is not None and service is not None
    assert latency > 2 * service
    # The backlog is answered after the window: those answers are not a rate of answers within it.
    assert 0 < result.ok_in_window < result.ok


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"url": "http://10.1.2.3:8000/predict"}, "loopback"),
        ({"url": "http://example.com/predict"}, "loopback"),
        ({"url": "https://127.0.0.1:8443/predict"}, "http://"),
        ({"rate": 10.0}, "exactly one"),
        ({"concurrency": None}, "exactly one"),
        ({"concurrency": 0}, "concurrency"),
        ({"retries": -1}, "retries"),
        ({"duration_s": 0}, "duration_s"),
        ({"bodies": []}, "bodies"),
        ({"headers": {"Content-Length": "3"}}, "Content-Length"),
    ],
)
def test_invalid_specs_are_refused(changes: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"url": "http://localhost:8000/p", "bodies": [BODY], "duration_s": 1, "concurrency": 1}
    with pytest.raises(ValueError, match=re.escape(message)):
        LoadSpec(**{**arguments, **changes})


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("response", "status", "keep_alive"),
    [
        (HEAD + b"Content-Length: 5\r\n\r\nhello", 200, True),
        (HEAD + b"Content-Length: 0\r\n\r\n", 200, True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, True),
        (b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno", 503, False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", 200, True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, False),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + b"Content-Length: 2\r\n\r\nok", 200, True),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nX-Trailer: 1\r\n\r\n", 200, True),
    ],
)
@pytest.mark.parametrize("step", [None, 1, 7])
def test_the_parser_finds_the_end_of_each_response(
    response: bytes, status: int, keep_alive: bool, step: int | None
) -> None:
    parser = ResponseParser()
    pieces = [response] if step is None else [response[i : i + step] for i in range(0, len(response), step)]
    assert [parser.feed(piece) for piece in pieces] == [False] * (len(pieces) - 1) + [True]
    assert (parser.status, parser.keep_alive) == (status, keep_alive)
    assert parser.feed(response)  # and ready for the next response


def test_bytes_beyond_a_response_spoil_its_connection() -> None:
    parser = ResponseParser()
    assert parser.feed(HEAD + b"Content-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
    assert parser.status == 200 and not parser.keep_alive


def test_the_parser_waits_for_the_close_where_no_length_is_given() -> None:
    parser = ResponseParser()
    assert not parser.feed(b"HTTP/1.0 200 OK\r\n\r\nsome body")
    assert not parser.feed(b"and more")
    assert parser.ends_at_close and parser.status == 200 and not parser.keep_alive


@pytest.mark.parametrize(
    "response",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
        b"HTTP/1.1 2x0 Odd\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * (1 << 17),
    ],
)
def test_the_parser_refuses_what_is_not_http(response: bytes) -> None:
    with pytest.raises(ValueError):
        ResponseParser().feed(response)


def test_poisson_arrivals_have_exponential_gaps_and_constant_ones_do_not() -> None:
    # A Poisson process at rate r: gaps of mean 1/r whose standard deviation equals their mean (coefficient of
    # variation 1), and about e^-1 of them longer than the mean. Pure arithmetic on the schedule, no clock.
    rate, count = 50.0, 20_000
    for arrivals, cv in (("poisson", 1.0), ("constant", 0.0)):
        times = list(itertools.islice(arrival_times(10.0, rate, arrivals, seed=3), count + 1))
        assert times[0] == 10.0
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = statistics.fmean(gaps)
        assert mean == pytest.approx(1 / rate, rel=0.03)
        assert statistics.pstdev(gaps) / mean == pytest.approx(cv, abs=0.03)
        if arrivals == "poisson":
            assert sum(gap > mean for gap in gaps) / count == pytest.approx(math.exp(-1), abs=0.02)
    seeded = list(itertools.islice(arrival_times(0.0, rate, "poisson", seed=1), 5))
    assert seeded == list(itertools.islice(arrival_times(0.0, rate, "poisson", seed=1), 5))


def test_remote_hosts_only_when_asked() -> None:
    with pytest.raises(ValueError, match="loopback"):
        LoadSpec("http://10.1.2.3:8000/predict", [BODY], duration_s=1, rate=1)
    spec = LoadSpec("http://10.1.2.3:8000/predict", [BODY], duration_s=1, rate=1, remote=True)
    assert spec.remote


def test_a_remote_spec_drives_a_named_host(lab_server: LabServer) -> None:
    # "localhost" spelled as a remote host still connects (by name, through the resolver) and counts the same.
    url = lab_server.url.replace("127.0.0.1", "localhost") + "/ok"
    result = run_level_sync(LoadSpec(url, [BODY], duration_s=0.3, rate=50, remote=True))
    assert_adds_up(result)
    assert result.ok == result.sent > 0
