"""twinserve's HTTP/1.1 protocol for uvicorn (servers/asgi/), fed bytes by hand over a stand-in transport: no
server, no socket. What uvicorn hands it is real (`uvicorn.Config`, `ServerState`); the apps are small ASGI
callables."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
import uvicorn
from uvicorn.server import ServerState

from twinserve.config import load_config
from twinserve.errors import QueueFull, TwinserveError
from twinserve.fronts.disconnect import DISCONNECT_EXTENSION
from twinserve.fronts.early import Head, Refusal
from twinserve.servers.asgi.protocol import HIGH_WATER, HttpProtocol
from twinserve.servers.holding import TICK_S
from twinserve.servers.served import Served
from twinserve.service.lifecycle import DECIDED, Decided

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
    app: App, app_state: dict[str, Any] | None = None, early: Any = None, service: Any = None, **settings: Any
) -> AsyncIterator[tuple[HttpProtocol, Transport, ServerState]]:
    """A connection of a server whose app made `early`, its refusal before the app (None: nothing refused), over
    `service` (None: none built; a stand-in counts what the server tells it)."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, proxy_headers=False, **settings)
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 01 Jan 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
    served = Served(load_config(read_timeout_s=READ_TIMEOUT_S), service=service, early=early)
    protocol = HttpProtocol(config=config, server_state=state, app_state=app_state or {}, served=served)
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


# -- requests and responses ---------------------------------------------------------------------------------------


def test_keep_alive_serves_one_request_after_another_with_the_servers_headers() -> None:
    scopes: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await text_app()(scope, receive, send)

    async def test() -> None:
        async with connection(app) as (protocol, transport, state):
            for _ in range(2):
                protocol.data_received(GET)
                await settle(state)
                [(status, headers, body)] = responses(transport.take())
                assert (status, body) == (200, b"ok")
                assert headers["server"] == "uvicorn" and headers["date"].startswith("Thu")
                assert "connection" not in headers and not transport.closed
            assert state.total_requests == 2

    run(test)
    scope = scopes[0]
    assert scope["type"] == "http" and scope["http_version"] == "1.1" and scope["method"] == "GET"
    assert scope["path"] == "/v2/health/live" and scope["raw_path"] == b"/v2/health/live"
    assert scope["client"] == ("127.0.0.1", 5000) and scope["server"] == ("127.0.0.1", 8000)
    assert scope["scheme"] == "http" and scope["headers"] == [(b"host", b"test")] and scope["query_string"] == b""
    assert scope["asgi"]["version"] == "3.0"


def test_the_scope_has_the_path_decoded_the_query_the_root_path_and_a_copy_of_the_state() -> None:
    seen: list[Any] = []
    state = {"shared": 1}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)
        await text_app()(scope, receive, send)

    async def test() -> None:
        async with connection(app, app_state=state, root_path="/api") as (protocol, _transport, server):
            protocol.data_received(b"GET /a%20b/c?x=1&y=%20 HTTP/1.1\r\nHost: t\r\nX-Odd: trailing  \r\n\r\n")
            await settle(server)

    run(test)
    scope = seen[0]
    assert scope["path"] == "/api/a b/c" and scope["raw_path"] == b"/api/a%20b/c" and scope["root_path"] == "/api"
    assert scope["query_string"] == b"x=1&y=%20"
    assert (b"x-odd", b"trailing") in scope["headers"]
    assert scope["state"] == state and scope["state"] is not state


def test_pipelined_requests_are_answered_in_order() -> None:
    async def test() -> None:
        slow_entered, go = asyncio.Event(), asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["path"] == "/slow":
                slow_entered.set()
                await go.wait()
            await text_app(scope["path"].encode())(scope, receive, send)

        async with connection(app) as (protocol, transport, state):
            protocol.data_received(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nGET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
            assert not transport.reading  # nothing more is read while a request waits behind another
            await asyncio.wait_for(slow_entered.wait(), 5)
            go.set()
            await settle(state)
            assert [body for _, _, body in responses(transport.take())] == [b"/slow", b"/fast"]
            assert transport.reading

    run(test)


def test_a_response_without_a_length_is_chunked_and_a_chunked_request_body_arrives_in_parts() -> None:
    received: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            received.append(message)
            Changes.note()
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hello ", "more_body": True})
        await send({"type": "http.response.body", "body": b"world"})

    async def test() -> None:
        async with connection(app) as (protocol, transport, state):
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await until(lambda: received)  # the app has the first part before the rest arrives
            protocol.data_received(b"1\r\n!\r\n0\r\n\r\n")
            await settle(state)
            [(_status, headers, body)] = responses(transport.take())
            assert headers["transfer-encoding"] == "chunked" and body == b"hello world"

    run(test)
    assert b"".join(m["body"] for m in received) == b"hello!" and received[-1]["more_body"] is False


def test_a_content_length_body_is_given_whole_and_a_wrong_length_answer_is_an_error() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": message["body"][:3]})

    async def test() -> None:
        async with connection(app) as (protocol, transport, state):
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhel")
            protocol.data_received(b"lo")
            await settle(state)
            assert responses(transport.take())[0][2] == b"hel"

    run(test)


def test_a_response_is_one_write_and_a_streams_head_goes_out_before_its_first_part() -> None:
    async def test() -> None:
        async with connection(text_app()) as (protocol, transport, state):
            protocol.data_received(GET)
            await settle(state)
            assert transport.writes == 1 and responses(transport.take())[0][2] == b"ok"
        part = asyncio.Event()

        async def stream(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await part.wait()
            await send({"type": "http.response.body", "body": b"event", "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async with connection(stream) as (protocol, transport, state):
            protocol.data_received(GET)
            await until(lambda: transport.written)
            assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n") and transport.written.endswith(b"\r\n\r\n")
            part.set()
            await settle(state)
            assert responses(transport.take())[0][2] == b"event"

    run(test)


def test_head_and_204_get_no_body() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        status = 204 if scope["path"] == "/none" else 200
        headers = [(b"content-length", b"5")] if status == 200 else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"hello" if status == 200 else b""})

    async def test() -> None:
        async with connection(app) as (protocol, transport, state):
            protocol.data_received(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
            await settle(state)
            raw = transport.take()
            assert raw.endswith(b"content-length: 5\r\n\r\n")
            protocol.data_received(b"GET /none HTTP/1.1\r\nHost: t\r\n\r\n")
            await settle(state)
            raw = transport.take()
            assert raw.startswith(b"HTTP/1.1 204 No Content\r\n") and raw.endswith(b"\r\n\r\n")
            assert b"transfer-encoding" not in raw

    run(test)


def test_100_continue_is_sent_only_when_the_app_first_reads_the_body() -> None:
    async def test() -> None:
        entered, go = asyncio.Event(), asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            entered.set()
            await go.wait()
            message = await receive()
            await text_app(message["body"])(scope, receive, send)

        async with connection(app) as (protocol, transport, state):
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
            await asyncio.wait_for(entered.wait(), 5)  # the app runs, and has not read yet
            assert transport.take() == b""
            go.set()
            await until(lambda: transport.written)
            assert transport.take() == b"HTTP/1.1 100 Continue\r\n\r\n"
            protocol.data_received(b"hi")
            await settle(state)
            assert responses(transport.take())[0][2] == b"hi"

    run(test)


def test_the_apps_connection_close_and_http_1_0_close_the_connection() -> None:
    async def test() -> None:
        async with connection(text_app(connection="close")) as (protocol, transport, state):
            protocol.data_received(GET)
            await settle(state)
            assert responses(transport.take())[0][1]["connection"] == "close" and transport.closed
        async with connection(text_app()) as (protocol, transport, state):
            protocol.data_received(b"GET / HTTP/1.0\r\n\r\n")
            await settle(state)
            raw = transport.take()
            assert raw.startswith(b"HTTP/1.1 200") and b"connection: close\r\n" in raw and transport.closed

    run(test)


def test_an_app_that_fails_before_answering_gets_a_500_and_after_it_a_closed_connection() -> None:
    async def fails(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def fails_late(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]})
        raise RuntimeError("boom")

    async def test() -> None:
        for app in (fails, silent):
            async with connection(app) as (protocol, transport, state):
                protocol.data_received(GET)
                await settle(state)
                [(status, headers, body)] = responses(transport.take())
                assert (status, body, headers["connection"]) == (500, b"Internal Server Error", "close")
                assert transport.closed
        async with connection(fails_late) as (protocol, transport, state):
            protocol.data_received(GET)
            await settle(state)
            assert transport.take().startswith(b"HTTP/1.1 200") and transport.closed

    run(test)


def test_a_header_with_a_line_break_is_refused() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1\r\nx-b: 2")]})

    async def test() -> None:
        async with connection(app) as (protocol, transport, state):
            protocol.data_received(GET)
            await settle(state)
            assert responses(transport.take())[0][0] == 500  # nothing of the bad head was written

    run(test)


# -- limits and refusals ------------------------------------------------------------------------------------------


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
            protocol.data_received(GET + b"GARBAGE\r\n\r\n")
            await asyncio.wait_for(entered.wait(), 5)
            assert transport.take() == b""
            go.set()
            await settle(state)
            assert [status for status, _, _ in responses(transport.take())] == [200, 400] and transport.closed
        assert service.counted == [(400, "malformed_http")]

    run(test)


def test_a_head_not_in_by_the_read_timeout_closes_the_connection_and_a_whole_one_arms_no_timer() -> None:
    async def test() -> None:
        async with connection(text_app()) as (protocol, transport, state):
            protocol.data_received(b"GET / HTTP/1.1\r\nHost")
            await until(lambda: transport.closed)  # at the read timeout, READ_TIMEOUT_S
            assert transport.take() == b""
        async with connection(text_app(), timeout_keep_alive=100) as (protocol, transport, state):
            timer = protocol._timer
            for _ in range(3):
                protocol.data_received(GET)
                await settle(state)
            assert protocol._timer is timer  # armed once, at the connection's start; each request re-armed nothing

    run(test)


def test_an_idle_kept_alive_connection_closes_after_the_keep_alive_timeout() -> None:
    async def test() -> None:
        async with connection(text_app(), timeout_keep_alive=0.1) as (protocol, transport, state):
            protocol.data_received(GET)
            await settle(state)
            assert not transport.closed
            await until(lambda: transport.closed)  # at the keep-alive timeout

    run(test)


def test_past_limit_concurrency_the_answer_is_503() -> None:
    async def test() -> None:
        async with connection(text_app(), limit_concurrency=1) as (protocol, transport, state):
            state.connections.add(object())  # type: ignore[arg-type]  # another connection, open
            protocol.data_received(GET)
            await settle(state)
            [(status, headers, body)] = responses(transport.take())
            assert (status, body, headers["connection"]) == (503, b"Service Unavailable", "close")

    run(test)


class _Refusing:
    """A stand-in for fronts/early.py `EarlyRefusal`: refuses POST /full from its head, lets POST /let-in in with
    what it decided (`decided`), leaves the rest to the app."""

    active = True

    def __init__(self) -> None:
        self.asked = 0
        self.decided = Decided(2, cast(Any, object()))

    def verdict(self, method: bytes, url: bytes, headers: Any) -> Refusal | Decided | None:
        self.asked += 1
        if url == b"/let-in":
            return self.decided
        return Refusal(QueueFull("full"), Head("/full", None, None, None)) if url == b"/full" else None

    def answer(self, refusal: Refusal, defaults: Any, keep_alive: bool) -> bytes:
        return b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nfull"

    def hold(self, method: bytes, url: bytes, headers: Any) -> tuple[Any, int, float] | None:
        return None


def test_a_request_refused_from_its_head_has_its_body_discarded_and_the_connection_kept() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await text_app()(scope, receive, send)

    async def test() -> None:
        early = _Refusing()
        async with connection(app, early=early) as (protocol, transport, state):
            protocol.data_received(b"POST /full HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
            assert transport.take().endswith(b"full")  # answered at once, before the body is in
            protocol.data_received(b"67890" + GET)
            await settle(state)
            [(status, _, body)] = responses(transport.take())
            assert (status, body) == (200, b"ok") and not transport.closed
            assert state.total_requests == 2

    run(test)
    assert seen == ["/v2/health/live"]


def test_a_request_let_in_from_its_head_carries_what_was_decided_to_the_app() -> None:
    """What the server decided from a head under a crowd reaches the app in the scope's extensions (`DECIDED`), for
    the app's exchange to take as made; a request it did not decide carries nothing (not the last one's)."""
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["extensions"].get(DECIDED))
        await text_app()(scope, receive, send)

    async def test() -> None:
        early = _Refusing()
        async with connection(app, early=early) as (protocol, transport, state):
            protocol.data_received(b"POST /let-in HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
            await settle(state)
            protocol.data_received(GET)
            await settle(state)
            assert [status for status, _, _ in responses(transport.take())] == [200, 200]
            assert seen == [early.decided, None]

    run(test)


def test_a_refused_body_not_in_by_the_read_timeout_closes_the_connection() -> None:
    async def test() -> None:
        early = _Refusing()
        async with connection(text_app(), early=early) as (protocol, transport, _state):
            protocol.data_received(b"POST /full HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
            await until(lambda: transport.closed)  # at the read timeout, READ_TIMEOUT_S

    run(test)


class _Full:
    """A model's queue (core/runtime.py `ModelRuntime`, as servers/holding.py sees it) that takes nothing until told."""

    def __init__(self) -> None:
        self.free = 0

    def admits(self, priority: int = 1) -> bool:
        return self.free > 0

    def room(self) -> int:
        return self.free


class _Holding(_Refusing):
    def __init__(self, queue: _Full) -> None:
        super().__init__()
        self.queue = queue

    def hold(self, method: bytes, url: bytes, headers: Any) -> tuple[Any, int, float] | None:
        return (self.queue, 1, 5.0) if url == b"/crowded" else None


def test_a_connection_answered_while_its_model_is_full_is_held_unread_until_the_queue_takes_again() -> None:
    async def test() -> None:
        queue = _Full()
        early = _Holding(queue)
        async with connection(text_app(), early=early) as (protocol, transport, state):
            protocol.data_received(b"POST /crowded HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
            await settle(state)
            assert responses(transport.take())[0][0] == 200
            assert not transport.reading  # its next request waits in TCP
            await asyncio.sleep(10 * TICK_S)  # a negative check: ten of the holds' polls pass, and it stays held
            assert not transport.reading
            queue.free = 1
            await until(lambda: transport.reading)
            protocol.data_received(GET)
            await settle(state)
            assert responses(transport.take())[0][0] == 200 and transport.reading

    run(test)


def test_a_held_connection_is_read_again_at_shutdown_and_its_next_answer_closes_it() -> None:
    async def test() -> None:
        early = _Holding(_Full())
        async with connection(text_app(), early=early) as (protocol, transport, state):
            protocol.data_received(b"POST /crowded HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
            await settle(state)
            transport.take()
            protocol.shutdown()
            assert transport.reading and not transport.closed
            protocol.data_received(GET)
            await settle(state)
            assert responses(transport.take())[0][1]["connection"] == "close" and transport.closed

    run(test)


def test_a_clients_connection_close_closes_after_the_answer() -> None:
    async def test() -> None:
        async with connection(text_app()) as (protocol, transport, state):
            protocol.data_received(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            await settle(state)
            assert responses(transport.take())[0][1]["connection"] == "close" and transport.closed

    run(test)


# -- the connection's life ----------------------------------------------------------------------------------------


def test_shutdown_closes_an_idle_connection_and_lets_a_running_request_finish_with_connection_close() -> None:
    async def test() -> None:
        entered, go = asyncio.Event(), asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            entered.set()
            await go.wait()
            await text_app()(scope, receive, send)

        async with connection(app) as (protocol, transport, state):
            protocol.shutdown()
            assert transport.closed
        async with connection(app) as (protocol, transport, state):
            protocol.data_received(GET)
            await asyncio.wait_for(entered.wait(), 5)
            protocol.shutdown()
            assert not transport.closed
            go.set()
            await settle(state)
            assert responses(transport.take())[0][1]["connection"] == "close" and transport.closed
            assert protocol not in state.connections

    run(test)


def test_a_lost_connection_is_a_disconnect_message_and_the_extension_says_so() -> None:
    seen: list[Any] = []

    async def test() -> None:
        started = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            gone = scope["extensions"][DISCONNECT_EXTENSION]["disconnected"]
            seen.append(gone())
            started.set()
            assert (await receive())["type"] == "http.request"
            seen.append(((await receive())["type"], gone()))

        async with connection(app) as (protocol, _transport, _state):
            protocol.data_received(GET)
            await asyncio.wait_for(started.wait(), 5)
            protocol.connection_lost(None)

    run(test)
    assert seen == [False, ("http.disconnect", True)]


def test_the_arrived_body_is_taken_whole_once_and_not_behind_100_continue() -> None:
    taken: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        take = scope["extensions"][DISCONNECT_EXTENSION]["body"]
        taken.append(take())
        taken.append(take())
        await text_app()(scope, receive, send)

    async def test() -> None:
        async with connection(app) as (protocol, _transport, state):
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody")
            await settle(state)
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbo")
            await settle(state)
            protocol.data_received(b"dy")
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
            await settle(state)

    run(test)
    assert taken == [b"body", None, None, None, None, None]


def test_a_large_body_pauses_reading_until_the_app_takes_it() -> None:
    async def test() -> None:
        go = asyncio.Event()
        sizes: list[int] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await go.wait()
            more = True
            while more:
                message = await receive()
                sizes.append(len(message["body"]))
                more = message["more_body"]
            await text_app()(scope, receive, send)

        async with connection(app) as (protocol, transport, state):
            size = 3 * HIGH_WATER
            protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
            protocol.data_received(b"x" * (2 * HIGH_WATER))
            assert not transport.reading
            go.set()
            await until(lambda: transport.reading)
            protocol.data_received(b"x" * HIGH_WATER)
            await settle(state)
            assert sum(sizes) == size and responses(transport.take())[0][0] == 200

    run(test)


def test_send_waits_while_the_transport_is_paused_for_writing() -> None:
    async def test() -> None:
        sending = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            sending.set()  # its task goes on into `send`, and waits there, before this test's wakes
            await text_app()(scope, receive, send)

        async with connection(app) as (protocol, transport, state):
            protocol.pause_writing()
            protocol.data_received(GET)
            await asyncio.wait_for(sending.wait(), 5)
            assert transport.take() == b""
            protocol.resume_writing()
            await settle(state)
            assert responses(transport.take())[0][0] == 200

    run(test)


def test_a_websocket_handshake_is_handed_to_uvicorns_websocket_protocol() -> None:
    handed: list[Any] = []

    class WebSocket(asyncio.Protocol):
        def __init__(self, config: Any, server_state: Any, app_state: Any) -> None:
            handed.append(("made", app_state))

        def connection_made(self, transport: Any) -> None:
            handed.append(("transport", transport))

        def data_received(self, data: bytes) -> None:
            handed.append(("data", data))

    async def test() -> None:
        async with connection(text_app(), app_state={"a": 1}, ws=WebSocket) as (protocol, transport, state):
            head = b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
            protocol.data_received(head + b"\x81\x00")
            assert transport.protocol is not protocol and protocol not in protocol.connections
            assert not state.tasks and transport.take() == b""

    run(test)
    assert handed[0] == ("made", {"a": 1}) and handed[1][0] == "transport"
    head = b"GET /ws HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n"
    assert handed[2] == ("data", head + b"\x81\x00")  # the head as parsed, and what came after it


def test_a_served_requests_objects_are_freed_without_the_garbage_collector() -> None:
    """The scope carries the request's cycle's own methods (`DISCONNECT_EXTENSION`): nothing may lead back from the
    cycle to the scope, or every request's objects are a reference cycle, left to the collector's full passes."""
    cycles: list[weakref.ref[Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert scope["extensions"][DISCONNECT_EXTENSION]["disconnected"]() is False
        cycles.append(weakref.ref(receive.__self__))
        await receive()
        await text_app()(scope, receive, send)

    async def test() -> None:
        async with connection(app) as (protocol, _transport, state):
            for _ in range(2):
                protocol.data_received(GET)
                await settle(state)

    gc.collect()
    gc.disable()
    try:
        run(test)
        assert cycles[0]() is None  # freed by reference counting alone, once the next request has begun
    finally:
        gc.enable()
