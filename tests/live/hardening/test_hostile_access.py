"""What a hostile client can still do about access (issue #20, cases 5 and 6), in every architecture.

5. Guessing API keys: wrong keys from one client address are limited (`--auth-failures-per-minute`): past the
   limit the address gets 429 + Retry-After for a minute, a correct key included, and the failures are logged in
   aggregate; keys shorter than 16 characters are refused at start-up unless `--allow-short-api-keys`.
6. Driving the server from a web page: a `Host` outside `--allowed-hosts` (DNS rebinding) is 400, and a
   WebSocket handshake from a foreign `Origin` (cross-site WebSocket hijacking) is 403, by default.

The pure policies first (`core/lockout.py`, `service/hosts.py`), then the apps in process (every architecture
answers the same status and body), then real servers for what needs a socket: the client's address as each
HTTP server reports it, and WebSocket handshakes.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields, without_request_id
from tests.inprocess import ARCHS_IN_PROCESS, Answer, served
from tests.serving import HTTP, Server, model_path, servers_per_arch
from twinserve.config import MIN_API_KEY_LENGTH, load_config
from twinserve.core.lockout import FailureLockout
from twinserve.errors import ConfigError, RateLimited, Unauthorized
from twinserve.service.auth import Authenticator, authenticator
from twinserve.service.clients import ForwardedFor
from twinserve.service.hosts import HostPolicy, host_of, host_policy

KEY = "hostile-access-key-0123456789"
WRONG = {"X-API-Key": "not-the-key-0123456789"}
RIGHT = {"X-API-Key": KEY}
ECHO = model_path("Echo")
PREDICT = "/v1/models/echo:predict"
BODY = {"instances": [1]}
#: Failures an address may make in a minute on the servers here.
LIMIT = 3


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the lockout, pure ---------------------------------------------------------------------------------------
def test_lockout_locks_an_address_after_its_limit_for_the_window() -> None:
    clock = FakeClock()
    lockout = FailureLockout(3, 60.0, clock=clock)
    for _ in range(2):
        lockout.failed("10.0.0.1")
        assert lockout.locked("10.0.0.1") is None
    lockout.failed("10.0.0.1")  # the third within the window
    assert lockout.locked("10.0.0.1") == pytest.approx(60.0)
    assert lockout.locked("10.0.0.2") is None  # other addresses are not affected
    clock.now += 59.5
    assert lockout.locked("10.0.0.1") == pytest.approx(0.5)
    clock.now += 0.5
    assert lockout.locked("10.0.0.1") is None
    lockout.failed("10.0.0.1")  # a fresh allowance after the lockout, not one more failure
    assert lockout.locked("10.0.0.1") is None


def test_lockout_counts_failures_within_the_window_only() -> None:
    clock = FakeClock()
    lockout = FailureLockout(3, 60.0, clock=clock)
    for _ in range(10):  # one failure every 30 s: never 3 within a minute
        lockout.failed("10.0.0.1")
        assert lockout.locked("10.0.0.1") is None
        clock.now += 30.0


def test_lockout_memory_is_bounded() -> None:
    clock = FakeClock()
    lockout = FailureLockout(2, 60.0, max_tracked=100, clock=clock)
    for i in range(10_000):
        lockout.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(lockout) == 100
    lockout.failed("10.0.0.1")
    lockout.failed("10.0.0.1")
    assert lockout.locked("10.0.0.1") is not None  # the most recent are kept


def test_lockout_reports_in_aggregate_not_per_failure() -> None:
    clock = FakeClock()
    lockout = FailureLockout(5, 60.0, report_every_s=60.0, clock=clock)
    assert lockout.report() is None  # nothing happened
    lockout.failed("10.0.0.1")
    first = lockout.report()  # the first failure after a quiet spell: at once
    assert first is not None and (first.failures, first.addresses, first.locked_out) == (1, 1, 0)
    for _ in range(200):
        lockout.failed("10.0.0.1")
        lockout.locked("10.0.0.1")
        assert lockout.report() is None  # within the interval: counted, not reported
    for _ in range(3):
        lockout.failed("10.0.0.2")
    clock.now += 60.0
    report = lockout.report()
    assert report is not None
    assert (report.failures, report.addresses) == (203, 2)
    # One failure was left from before, so the lockouts came at the 4th, 9th, ... 199th failure: 40 of them;
    # every request after the first lockout was refused (197): the clock stood still.
    assert (report.locked_out, report.refused) == (40, 197)
    assert report.top[0] == ("10.0.0.1", 200) and report.top[1] == ("10.0.0.2", 3)
    assert lockout.report() is None


def test_authenticator_refuses_a_locked_out_address_even_with_the_right_key(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    auth = Authenticator([KEY], lockout=FailureLockout(LIMIT, 60.0, clock=clock))
    wrong, right = httpx.Headers(WRONG), httpx.Headers(RIGHT)
    caplog.set_level(logging.WARNING, "twinserve.auth")
    for _ in range(20):  # a missing key guesses nothing: it is not counted
        with pytest.raises(Unauthorized):
            auth.authenticate(httpx.Headers({}), "10.0.0.1")
    for _ in range(LIMIT):
        with pytest.raises(Unauthorized):
            auth.authenticate(wrong, "10.0.0.1")
    for headers in (wrong, right, httpx.Headers({})):
        with pytest.raises(RateLimited) as limited:
            auth.authenticate(headers, "10.0.0.1")
        assert limited.value.headers["Retry-After"] == "60"
    assert auth.authenticate(right, "10.0.0.2")  # another address
    assert auth.authenticate(right, None)  # an unknown address is never locked out
    clock.now += 60.0
    assert auth.authenticate(right, "10.0.0.1")
    lines = [r.getMessage() for r in caplog.records if r.name == "twinserve.auth"]
    assert len(lines) == 2, lines  # the first failure at once, then the rest of the minute in one line
    assert "1 wrong API key(s) from 1 address(es)" in lines[0]
    assert "2 wrong API key(s)" in lines[1] and "1 address(es) locked out, 3 request(s) refused" in lines[1]
    assert all(KEY not in line and WRONG["X-API-Key"] not in line for line in lines)


def test_short_keys_are_refused_at_start_up_unless_allowed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert MIN_API_KEY_LENGTH == 16
    with pytest.raises(ConfigError) as refused:
        load_config(api_keys=["a"])
    message = str(refused.value)
    assert "\n" not in message and "shorter than 16 characters" in message and "--allow-short-api-keys" in message
    key_file = tmp_path / "keys"
    key_file.write_text(f"{KEY}\nshort-key\n")
    with pytest.raises(ConfigError, match="1 API key\\(s\\) shorter than 16") as from_file:
        load_config(api_key_file=str(key_file))
    assert "short-key" not in str(from_file.value)  # the key is never shown
    assert load_config(api_keys=["x" * 16]).auth_enabled
    config = load_config(api_keys=["a"], allow_short_api_keys=True)
    caplog.set_level(logging.WARNING, "twinserve.auth")
    assert authenticator(config) is not None
    assert any("shorter than 16 characters accepted" in r.getMessage() for r in caplog.records)


def test_short_key_refused_by_the_command_line() -> None:
    server = Server([ECHO], "async", "--api-key", "a")
    with pytest.raises(RuntimeError, match="shorter than 16 characters"):
        server.start()


# -- the client's address behind proxies, pure ------------------------------------------------------------------
def test_forwarded_for_is_read_only_from_trusted_proxies() -> None:
    forwarded = ForwardedFor(["127.0.0.1", "::1", "10.0.0.0/8"])
    assert forwarded.client("203.0.113.9", "198.51.100.1") == "203.0.113.9"  # an untrusted peer's header: ignored
    assert forwarded.client("127.0.0.1", None) == "127.0.0.1"
    assert forwarded.client("127.0.0.1", "198.51.100.1") == "198.51.100.1"
    # The rightmost hop that is not a trusted proxy: what the client wrote further left proves nothing.
    assert forwarded.client("10.1.1.1", "6.6.6.6, 198.51.100.1, 10.2.2.2") == "198.51.100.1"
    assert forwarded.client("::1", "10.2.2.2, 10.3.3.3") == "10.2.2.2"  # all trusted: the first
    assert forwarded.client("127.0.0.1", " , ") == "127.0.0.1"
    assert ForwardedFor([]).client("127.0.0.1", "198.51.100.1") == "127.0.0.1"
    assert ForwardedFor(["*"]).client("203.0.113.9", "198.51.100.1") == "198.51.100.1"
    with pytest.raises(ConfigError, match=r"--forwarded-allow-ips: .*'proxy\.example' is neither"):
        load_config(forwarded_allow_ips=["proxy.example"])


# -- allowed hosts and WebSocket origins, pure ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("localhost", "localhost"),
        ("LocalHost:8000", "localhost"),
        ("127.0.0.1:8000", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("api.example.", "api.example"),
        ("::1", ""),  # IPv6 without brackets is not a Host
        ("[::1]x", ""),
    ],
)
def test_host_of_takes_port_brackets_and_case_off(header: str, host: str) -> None:
    assert host_of(header) == host


@pytest.mark.parametrize(
    ("bind", "allowed", "refused"),
    [
        ("127.0.0.1", ["localhost:8000", "127.0.0.1", "[::1]:1", "LOCALHOST", None], ["evil.example", "10.0.0.1", ""]),
        ("::1", ["[::1]:8000", "localhost"], ["evil.example"]),
        ("10.1.2.3", ["10.1.2.3:8000"], ["localhost", "evil.example"]),
        ("0.0.0.0", ["evil.example", "10.1.2.3:8000", "anything"], []),  # any host: say so in the docs
        ("::", ["evil.example"], []),
    ],
)
def test_default_allowed_hosts_follow_the_bind_address(
    bind: str, allowed: list[str | None], refused: list[str]
) -> None:
    policy = host_policy(load_config(host=bind))
    assert [policy.allows_host(h) for h in allowed] == [True] * len(allowed)
    assert [policy.allows_host(h) for h in refused] == [False] * len(refused)


def test_allowed_hosts_patterns() -> None:
    policy = host_policy(load_config(allowed_hosts=["API.example", ".corp.example", "*.svc.local", "[::2]"]))
    assert policy.allows_host("api.example:443") and policy.allows_host("corp.example")
    assert policy.allows_host("a.b.corp.example") and policy.allows_host("x.svc.local")
    assert policy.allows_host("[::2]:8000")
    assert not policy.allows_host("localhost") and not policy.allows_host("evilcorp.example")
    assert not policy.allows_host("api.example.evil.example")
    assert host_policy(load_config(allowed_hosts=["*"])).allows_host("evil.example")
    with pytest.raises(ConfigError, match=r"--allowed-hosts: .*'https://api\.example' is not a host name"):
        load_config(allowed_hosts=["https://api.example"])


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),  # the same origin
        ("http://localhost:8000", "127.0.0.1:8000", True),  # a named allowed host
        ("https://evil.example", "127.0.0.1:8000", False),
        ("http://evil.example:8000", "evil.example:8000", True),  # same origin: the Host check refuses it first
        ("null", "127.0.0.1:8000", False),
        ("file://", "127.0.0.1:8000", False),
    ],
)
def test_websocket_origin_on_loopback(origin: str, host: str, allowed: bool) -> None:
    assert host_policy(load_config()).allows_origin(origin, host) is allowed


def test_websocket_origin_on_any_host_is_same_origin_only() -> None:
    policy = HostPolicy(["*"])
    assert policy.allows_origin("http://10.1.2.3:8000", "10.1.2.3:8000")
    assert not policy.allows_origin("https://evil.example", "10.1.2.3:8000")


# -- in process, every architecture ---------------------------------------------------------------------------
def _error(answer: Answer, status: int, code: str) -> dict[str, Any]:
    assert answer.status == status, answer.text
    body = error_fields(answer.json())
    assert body["code"] == code and body["request_id"] == answer.headers["x-request-id"]
    return {k: v for k, v in body.items() if k != "request_id"}


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_lockout_in_process(arch: str) -> None:
    with served(arch, [ECHO], api_keys=[KEY], auth_failures_per_minute=LIMIT, workers=1) as app:
        for _ in range(5):
            _error(app.request("POST", PREDICT, json=BODY), 401, "unauthorized")  # no key: not counted
        for _ in range(LIMIT):
            _error(app.request("POST", PREDICT, json=BODY, headers=WRONG), 401, "unauthorized")
        bodies = []
        for headers in (WRONG, RIGHT):
            answer = app.request("POST", PREDICT, json=BODY, headers=headers)
            bodies.append(_error(answer, 429, "rate_limited"))
            assert 1 <= int(answer.headers["retry-after"]) <= 60
        assert bodies[0] == bodies[1]
        assert "--auth-failures-per-minute" in bodies[0]["message"]
        assert app.request("GET", "/v2/health/ready").status == 200  # probes need no key, so no lockout


#: Headers whose presence and value must not depend on the architecture.
COMPARED_HEADERS = ("retry-after", "www-authenticate", "access-control-allow-origin", "vary", "content-type")


def _comparable(answer: Answer) -> tuple[int, dict[str, str], Any]:
    body = answer.json()
    body = without_request_id(body)
    headers = {name: answer.headers[name] for name in COMPARED_HEADERS if name in answer.headers}
    return answer.status, headers, body


def test_same_answers_in_every_architecture() -> None:
    """One sequence of hostile requests, the same status, headers and body (less the request id) everywhere."""
    origin = {"Origin": "https://app.example"}
    sequence: list[tuple[str, str, dict[str, str], Any]] = [
        ("POST", PREDICT, {"Host": "evil.example", **RIGHT}, BODY),
        ("OPTIONS", PREDICT, {"Host": "evil.example", **origin, "Access-Control-Request-Method": "POST"}, None),
        ("GET", "/v1/models", {"Host": "evil.example"}, None),
        ("POST", PREDICT, origin, BODY),  # no key: not counted
        *[("POST", PREDICT, {**WRONG, **origin}, BODY)] * LIMIT,
        ("POST", PREDICT, {**RIGHT, **origin}, BODY),  # locked out
        ("POST", "/v2/models/echo/infer", RIGHT, {"inputs": []}),  # locked out, V2's body
        ("GET", "/nowhere", RIGHT, None),
        ("GET", "/v2/health/live", {}, None),
    ]
    answers: dict[str, list[tuple[int, dict[str, str], Any]]] = {}
    for arch in ARCHS_IN_PROCESS:
        settings = {"api_keys": [KEY], "auth_failures_per_minute": LIMIT, "workers": 1}
        with served(arch, [ECHO], cors_origins=["https://app.example"], **settings) as app:
            answers[arch] = [
                _comparable(app.request(method, path, json=body, headers=headers))
                for method, path, headers, body in sequence
            ]
    assert answers["async"] == answers["sync"] and answers["hybrid"] == answers["sync"]
    statuses = [status for status, _, _ in answers["sync"]]
    assert statuses == [400, 400, 400, 401, *[401] * LIMIT, 429, 429, 429, 200]


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_lockout_behind_a_trusted_proxy_counts_each_client(arch: str) -> None:
    """The in-process clients connect from 127.0.0.1, a trusted proxy by default: X-Forwarded-For names the client."""
    with served(arch, [ECHO], api_keys=[KEY], auth_failures_per_minute=LIMIT, workers=1) as app:
        guesser, other = {"X-Forwarded-For": "198.51.100.7"}, {"X-Forwarded-For": "198.51.100.8"}
        for _ in range(LIMIT):
            _error(app.request("POST", PREDICT, json=BODY, headers={**WRONG, **guesser}), 401, "unauthorized")
        _error(app.request("POST", PREDICT, json=BODY, headers={**RIGHT, **guesser}), 429, "rate_limited")
        assert app.request("POST", PREDICT, json=BODY, headers={**RIGHT, **other}).status == 200
        assert app.request("POST", PREDICT, json=BODY, headers=RIGHT).status == 200  # the proxy itself


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_foreign_host_is_400_everywhere(arch: str) -> None:
    with served(arch, [ECHO], cors_origins=["https://app.example"]) as app:
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example"):
            for method, path, extra in [
                ("POST", PREDICT, {}),
                ("GET", "/v1/models", {}),
                ("GET", "/nowhere", {}),
                # A preflight is answered after the Host check, not before.
                ("OPTIONS", PREDICT, {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}),
            ]:
                answer = app.request(
                    method, path, json=BODY if method == "POST" else None, headers={"Host": host, **extra}
                )
                body = _error(answer, 400, "host_not_allowed")
                assert body["message"] == f"host {host_of(host)!r} is not served here (--allowed-hosts)"
                assert "access-control-allow-origin" not in answer.headers
            # V2 routes answer with the Open Inference Protocol's body, as for every other error.
            v2 = app.request("POST", "/v2/models/echo/infer", content=b"{}", headers={"Host": host})
            assert v2.status == 400
            assert v2.json() == {"error": f"host {host_of(host)!r} is not served here (--allowed-hosts)"}
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST"):
            answer = app.request("POST", PREDICT, json=BODY, headers={"Host": host})
            assert answer.status == 200 and answer.json() == {"predictions": [1]}, (host, answer.text)


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
@pytest.mark.parametrize("settings", [{"allowed_hosts": ["*"]}, {"host": "0.0.0.0"}])
def test_any_host_when_bound_everywhere_or_opted_out(arch: str, settings: dict[str, Any]) -> None:
    with served(arch, [ECHO], **settings) as app:
        assert app.request("POST", PREDICT, json=BODY, headers={"Host": "evil.example"}).status == 200
        # A Kubernetes probe names the pod's address.
        assert app.request("GET", "/v2/health/ready", headers={"Host": "10.1.2.3:8000"}).status == 200


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_named_allowed_hosts(arch: str) -> None:
    with served(arch, [ECHO], allowed_hosts=["api.example"]) as app:
        assert app.request("POST", PREDICT, json=BODY, headers={"Host": "API.example:443"}).status == 200
        _error(app.request("POST", PREDICT, json=BODY, headers={"Host": "localhost"}), 400, "host_not_allowed")


# -- real servers: the client's address from the socket, WebSocket handshakes ----------------------------------
@pytest.fixture(scope="module")
def guarded() -> Iterator[dict[str, Server]]:
    """One server per architecture on loopback, with a key and a lockout of LIMIT failures a minute."""

    def make(arch: str) -> Server:
        flags = ("--workers", "1", "--api-key", KEY, "--auth-failures-per-minute", str(LIMIT))
        return Server([ECHO], arch, *flags)

    with servers_per_arch(ARCHS, make) as started:
        yield started


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _client(server: Server, source: str) -> httpx.Client:
    """A client whose connections come from `source` (any 127.0.0.0/8 address is loopback): each test its own
    address, so that one test's lockout is not another's."""
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=server.url, transport=transport, timeout=30)


def test_wrong_keys_lock_the_address_out_on_a_real_server(guarded: dict[str, Server], arch: str) -> None:
    server = guarded[arch]
    with _client(server, "127.0.0.2") as client, _client(server, "127.0.0.3") as neighbour:
        for _ in range(LIMIT):
            assert client.post(PREDICT, json=BODY, headers=WRONG).status_code == 401
        refused = client.post(PREDICT, json=BODY, headers=RIGHT)
        assert refused.status_code == 429 and error_fields(refused.json())["code"] == "rate_limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # A forged X-Forwarded-For from an untrusted peer changes nothing (uvicorn trusts only 127.0.0.1).
        forged = client.post(PREDICT, json=BODY, headers={**RIGHT, "X-Forwarded-For": "203.0.113.9"})
        assert forged.status_code == 429
        assert neighbour.post(PREDICT, json=BODY, headers=RIGHT).json() == {"predictions": [1]}
    server.wait_for_output("authentication failures: 1 wrong API key(s) from 1 address(es)")
    assert server.output().count("authentication failures") == 1  # one line for the minute, not one per failure


def test_a_trusted_proxy_forwards_the_client_address_on_a_real_server(guarded: dict[str, Server], arch: str) -> None:
    """From 127.0.0.1 (trusted by default, by uvicorn as by twinserve), X-Forwarded-For names the client."""
    server = guarded[arch]
    with _client(server, "127.0.0.1") as proxy:
        guesser, other = {"X-Forwarded-For": "198.51.100.7"}, {"X-Forwarded-For": "198.51.100.8"}
        for _ in range(LIMIT):
            assert proxy.post(PREDICT, json=BODY, headers={**WRONG, **guesser}).status_code == 401
        assert proxy.post(PREDICT, json=BODY, headers={**RIGHT, **guesser}).status_code == 429
        assert proxy.post(PREDICT, json=BODY, headers={**RIGHT, **other}).status_code == 200
        assert proxy.post(PREDICT, json=BODY, headers=RIGHT).status_code == 200


def _handshake(server: Server, headers: dict[str, str], source: str = "127.0.0.1") -> tuple[int, bytes]:
    """The status and body of a WebSocket handshake sent as raw bytes (so that Host can be anything)."""
    head = {
        "Host": f"127.0.0.1:{server.port}",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        **headers,
    }
    request = "GET /v1/models/echo/ws HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=(source, 0)) as conn:
        conn.sendall(request.encode())
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
        status_line, _, rest = received.partition(b"\r\n")
        status = int(status_line.split()[1])
        head_end = rest.find(b"\r\n\r\n")
        fields = dict(
            line.decode("latin-1").lower().split(": ", 1) for line in rest[:head_end].split(b"\r\n") if b": " in line
        )
        body = rest[head_end + 4 :]
        length = int(fields.get("content-length", "0")) if status != 101 else 0
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, body


def test_websocket_from_a_foreign_origin_is_refused(guarded: dict[str, Server], arch: str) -> None:
    server = guarded[arch]
    foreign = _handshake(server, {**RIGHT, "Origin": "https://evil.example"})
    if arch == "sync":  # no WebSockets at all
        assert foreign[0] == 501
        return
    assert foreign[0] == 403 and error_fields(json.loads(foreign[1]))["code"] == "cors_rejected"
    assert _handshake(server, {**RIGHT, "Origin": "null"})[0] == 403
    assert _handshake(server, RIGHT)[0] == 101  # a program, not a page: no Origin
    assert _handshake(server, {**RIGHT, "Origin": f"http://127.0.0.1:{server.port}"})[0] == 101  # same origin
    assert _handshake(server, {**RIGHT, "Origin": f"http://localhost:{server.port}"})[0] == 101


def test_websocket_and_http_with_a_foreign_host_are_400(guarded: dict[str, Server], arch: str) -> None:
    server = guarded[arch]
    status, body = _handshake(server, {**RIGHT, "Host": "evil.example", "Origin": "http://evil.example"})
    assert status == 400 and error_fields(json.loads(body))["code"] == "host_not_allowed"
    response = HTTP.post(server.url + PREDICT, json=BODY, headers={**RIGHT, "Host": "evil.example"})
    assert response.status_code == 400 and error_fields(response.json())["code"] == "host_not_allowed"


def test_websocket_handshake_from_a_locked_out_address(guarded: dict[str, Server], arch: str) -> None:
    server = guarded[arch]
    # The sync architecture authenticates before it answers 501: its handshakes are locked out alike.
    for _ in range(LIMIT):
        assert _handshake(server, WRONG, source="127.0.0.4")[0] == 401
    status, body = _handshake(server, RIGHT, source="127.0.0.4")
    assert status == 429 and error_fields(json.loads(body))["code"] == "rate_limited"
