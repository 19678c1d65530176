"""What servers/asgi/protocol.py adds to uvicorn's httptools protocol (a head deadline, head limits, twinserve's
error body, the 400 after the answers before it), fed bytes by hand over a stand-in transport: no server, no
socket. What uvicorn hands it is real (`uvicorn.Config`, `ServerState`); the apps are small ASGI callables."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from twinserve.config import load_config
from twinserve.errors import TwinserveError
from twinserve.servers.asgi.protocol import BoundedHttpToolsProtocol
from twinserve.servers.served import Served

READ_TIMEOUT_S = 0.3
GET = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n"
App = Callable[[Any, Any, Any], Awaitable[None]]


class Changes:
    """Wakes `until` when the stand-in transport changes (or a test's app notes a step), instead of a poll."""

    event: asyncio.Event | None = None

    @classmethod
    def note(cls) -> None:
        if cls.event is not None:
            cls.event.set()


class Transport:
    """Just enough of an asyncio transport: what the protocol writes, and its close, as a loop's transport does
    (`connection_lost` on the loop's next turn); each change wakes `until` (`Changes`)."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol
        self.written = bytearray()
        self.writes = 0
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data
        self.writes += 1
        Changes.note()

    def writelines(self, data: Any) -> None:
        for part in data:
            self.write(part)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
            Changes.note()

    def pause_reading(self) -> None:
        self.reading = False
        Changes.note()

    def resume_reading(self) -> None:
        self.reading = True
        Changes.note()

    def set_protocol(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol

    def take(self) -> bytes:
        out = bytes(self.written)
        self.written.clear()
        return out


class Unparsed:
    """A stand-in service: what the server counted as requests it could not parse (`Service.unparsed`)."""

    def __init__(self) -> None:
        self.counted: list[tuple[int, str]] = []

    def unparsed(self, error: TwinserveError) -> None:
        self.counted.append((error.status, error.code))


@asynccontextmanager
async def connection(
    app: App, service: Any = None, **settings: Any
) -> AsyncIterator[tuple[BoundedHttpToolsProtocol, Transport, ServerState]]:
    """A connection of a server over `service` (None: none built; a stand-in counts what the server tells it)."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, proxy_headers=False, **settings)
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 01 Jan 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
    served = Served(load_config(read_timeout_s=READ_TIMEOUT_S), service=service)
    protocol = BoundedHttpToolsProtocol(config=config, server_state=state, app_state={}, served=served)
    transport = Transport(protocol)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    try:
        yield protocol, transport, state
    finally:
        await asyncio.wait_for(asyncio.gather(*state.tasks, return_exceptions=True), 5)


async def settle(state: ServerState) -> None:
    """Until every app task has finished (and the loop has run the callbacks they left)."""
    while state.tasks:
        await asyncio.wait_for(asyncio.gather(*state.tasks, return_exceptions=True), 5)
    await asyncio.sleep(0)  # one turn: the callbacks the tasks left (a head's flush, a closed connection's loss)


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Let the loop run until `condition()` holds, looking again at each change `Changes` notes; fail after
    `timeout` seconds."""
    event = Changes.event = asyncio.Event()
    try:
        async with asyncio.timeout(timeout):
            while True:
                event.clear()  # before the look: a change after it sets the event again
                if condition():
                    return
                await event.wait()
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s") from None
    finally:
        Changes.event = None


def responses(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses in `raw`: status, headers (lower-cased names, last wins), body (de-chunked)."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
        if status == 100:
            out.append((status, headers, b""))
            continue
        if "content-length" in headers:
            length = int(headers["content-length"])
            body, raw = raw[:length], raw[length:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, raw = raw.partition(b"\r\n")
                size = int(size_line, 16)
                body += raw[:size]
                raw = raw[size + 2 :]
                if size == 0:
                    break
        else:
            body = b""
        out.append((status, headers, body))
    return out


def text_app(body: bytes = b"ok", **headers: str) -> App:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        fields = [(b"content-length", str(len(body)).encode())] + [
            (k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()
        ]
        await send({"type": "http.response.start", "status": 200, "headers": fields})
        await send({"type": "http.response.body", "body": body})

    return app


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())  # type: ignore[arg-type]


# -- what the subclass adds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431, "headers_too_large"),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n", 431, "headers_too_large"),
        (b"GARBAGE\r\n\r\n", 400, "malformed_http"),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "malformed_http"),
    ],
    ids=["long target", "long header", "many headers", "no version", "length and chunked"],
)
def test_a_refused_head_gets_twinserves_json_error_and_closes(raw: bytes, status: int, code: str) -> None:
    async def test() -> None:
        service = Unparsed()
        async with connection(text_app(), service=service) as (protocol, transport, state):
            protocol.data_received(raw)
            [(got, headers, body)] = responses(transport.take())
            assert (got, headers["content-type"]) == (status, "application/json")
            assert code in json.dumps(json.loads(body)) and transport.closed
            assert not state.tasks
        assert service.counted == [(status, code)]  # counted once, by the service (no exchange was opened)

    run(test)


def test_a_body_broken_while_its_app_reads_it_is_answered_400_and_left_to_the_app_to_count() -> None:
    """The app of a request whose body breaks has run, and counts the request: the server does not count it again
    as one no app saw (`Service.unparsed`), as it does a broken head."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive())["type"] == "http.request":
            Changes.note()

    async def test() -> None:
        service = Unparsed()
        async with connection(app, service=service) as (protocol, transport, _state):
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            protocol.data_received(b"zz\r\n")  # not a chunk size
            assert responses(transport.take())[0][0] == 400 and transport.closed
        assert service.counted == []

    run(test)


def test_a_head_trickled_past_its_byte_bound_is_431() -> None:
    async def test() -> None:
        async with connection(text_app()) as (protocol, transport, _state):
            protocol.data_received(b"GET / HTTP/1.1\r\n")
            for _ in range(200):  # each field under its limit, but the head never ends
                if transport.closed:
                    break
                protocol.data_received(b"X-A: " + b"a" * 8000)
            assert responses(transport.take())[0][0] == 431 and transport.closed

    run(test)


def test_a_malformed_request_behind_one_being_answered_is_refused_after_its_answer() -> None:
    async def test() -> None:
        entered, go = asyncio.Event(), asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            entered.set()
            await go.wait()
            await text_app()(scope, receive, send)

        service = Unparsed()
        async with connection(app, service=service) as (protocol, transport, state):
            protocol.data_received(GET * 2 + b"GARBAGE\r\n\r\n")  # the second waits behind the first
            await asyncio.wait_for(entered.wait(), 5)
            assert transport.take() == b""
            go.set()
            await settle(state)
            assert [status for status, _, _ in responses(transport.take())] == [200, 200, 400] and transport.closed
        assert service.counted == [(400, "malformed_http")]

    run(test)


def test_a_head_not_in_by_the_read_timeout_closes_the_connection_and_a_whole_one_is_served_past_it() -> None:
    async def test() -> None:
        async with connection(text_app()) as (protocol, transport, state):
            protocol.data_received(b"GET / HTTP/1.1\r\nHost")
            await until(lambda: transport.closed)  # at the read timeout, READ_TIMEOUT_S
            assert transport.take() == b""
        async with connection(text_app(), timeout_keep_alive=100) as (protocol, transport, state):
            for _ in range(3):  # whole heads: each served, none cut off by a deadline armed for an earlier one
                protocol.data_received(GET)
                await settle(state)
            await asyncio.sleep(2 * READ_TIMEOUT_S)
            assert [status for status, _, _ in responses(transport.take())] == [200] * 3 and not transport.closed

    run(test)


def test_a_silent_new_connection_closes_at_the_read_timeout() -> None:
    async def test() -> None:
        async with connection(text_app(), timeout_keep_alive=100) as (_protocol, transport, _state):
            await until(lambda: transport.closed)
            assert transport.take() == b""

    run(test)


def test_a_pipelined_request_whose_body_breaks_is_refused_after_the_answer_before_it_and_never_run() -> None:
    async def test() -> None:
        entered, go = asyncio.Event(), asyncio.Event()
        paths: list[str] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            paths.append(scope["path"])
            entered.set()
            await go.wait()
            await text_app()(scope, receive, send)

        service = Unparsed()
        async with connection(app, service=service) as (protocol, transport, state):
            broken = b"POST /second HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            protocol.data_received(GET + broken)
            await asyncio.wait_for(entered.wait(), 5)
            go.set()
            await settle(state)
            assert [status for status, _, _ in responses(transport.take())] == [200, 400] and transport.closed
        assert paths == ["/v2/health/live"] and service.counted == [(400, "malformed_http")]

    run(test)
