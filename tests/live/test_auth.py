"""API keys and CORS: the pure policies, then real servers of every architecture answering alike."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.conftest import ARCHS
from tests.errors import error_fields, without_request_id
from tests.serving import HTTP, Server, model_path, servers_per_arch
from twinserve.cli import build_parser
from twinserve.config import load_config
from twinserve.errors import ConfigError, CorsRejected, RateLimited, Unauthorized
from twinserve.service.auth import KeyRing, credentials_from, key_id
from twinserve.service.contract import Service
from twinserve.service.cors import ALLOWED_HEADERS, CorsPolicy

KEY_FLAG, KEY_FILE, KEY_LIMITED = "flag-key-0123456789", "file-key-0123456789", "limited-key-0123456789"
#: Keys of the tests that run last on the module's servers (5 requests/s per key): their buckets are full when they
#: start, whatever the tests before them spent of the others' in the same second.
KEY_SOCKET, KEY_STREAM = "socket-key-0123456789", "stream-key-0123456789"
ORIGIN = "https://app.example"
IRIS = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}


# -- the pure parts ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"authorization": "Bearer k1"}, "k1"),
        ({"authorization": "bearer   k1 "}, "k1"),
        ({"x-api-key": "k2"}, "k2"),
        ({"authorization": "Basic dXNlcjpwYXNz", "x-api-key": "k2"}, "k2"),
        ({"authorization": "Bearer "}, None),
        ({"x-api-key": "  "}, None),
        ({}, None),
    ],
)
def test_credentials_from_either_header(headers: dict[str, str], expected: str | None) -> None:
    assert credentials_from(httpx.Headers(headers)) == expected


def test_key_ring_matches_by_digest_and_names_keys_by_id() -> None:
    ring = KeyRing(["alpha-key", "beta-key", "alpha-key"])
    assert ring.ids == (key_id("alpha-key"), key_id("beta-key"))
    assert ring.match("beta-key") == key_id("beta-key")
    assert ring.match("beta-ke") is None and ring.match("beta-key ") is None and ring.match("") is None
    assert all(len(kid) == 8 and "key" not in kid for kid in ring.ids)


@pytest.mark.parametrize("presented", ["k0-secret", "k3-secret", "wrong", "a-much-longer-wrong-key" * 10])
def test_every_key_is_compared_whatever_matches(presented: str, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", compare_digest)  # the module auth compares with
    ring = KeyRing([f"k{i}-secret" for i in range(4)])
    ring.match(presented)
    # No early exit at a match, and equal-length digests: neither position nor length shows in the timing.
    assert compared == [(32, 32)] * 4


def test_authenticator_refuses_with_a_challenge_and_limits_each_key() -> None:
    auth = Service({}, load_config(workers=1, api_keys="one-key-0123456789,two-key-0123456789", rate_limit_per_key=2))
    with pytest.raises(Unauthorized) as missing:
        auth.authenticate(httpx.Headers({}))
    assert missing.value.headers["WWW-Authenticate"] == 'Bearer realm="twinserve"'
    with pytest.raises(Unauthorized) as wrong:
        auth.authenticate(httpx.Headers({"x-api-key": "three-key"}))
    assert 'error="invalid_token"' in wrong.value.headers["WWW-Authenticate"]
    assert "three-key" not in wrong.value.message
    one = httpx.Headers({"authorization": "Bearer one-key-0123456789"})
    assert auth.authenticate(one) == auth.authenticate(one) == key_id("one-key-0123456789")
    with pytest.raises(RateLimited) as limited:
        auth.authenticate(one)
    assert int(limited.value.headers["Retry-After"]) >= 1
    assert auth.authenticate(httpx.Headers({"x-api-key": "two-key-0123456789"})) == key_id(
        "two-key-0123456789"
    )  # its own bucket


def test_keys_from_flags_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keys of 16 characters or more: shorter ones are refused at start-up (tests/live/hardening/test_hostile_access.py).
    env_a, env_b, file_a, file_b, flag_a, flag_b, flag_c = (
        f"{name}-0123456789ab" for name in ("env-a", "env-b", "file-a", "file-b", "flag-a", "flag-b", "flag-c")
    )
    key_file = tmp_path / "keys"
    key_file.write_text(f"# rotated monthly\n{file_a}\n\n  {file_b}  \n{flag_a}\n")
    monkeypatch.setenv("TWINSERVE_API_KEYS", f"{env_a},{env_b}")
    assert load_config().all_api_keys() == [env_a, env_b]
    assert load_config(api_key_file=str(key_file)).all_api_keys() == [env_a, env_b, file_a, file_b, flag_a]
    # The flag is the same setting as the variable, so it replaces it (as every flag does); the file adds to it.
    args = build_parser().parse_args(["serve", "--api-key", flag_a, "--api-keys", f"{flag_b},{flag_c}"])
    config = load_config(api_keys=args.api_keys, api_key_file=str(key_file))
    assert config.all_api_keys() == [flag_a, flag_b, flag_c, file_a, file_b]
    assert flag_a not in repr(config)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"api_keys": ["has space"]}, "--api-keys: Value error, an API key must be non-empty visible ASCII"),
        ({"api_key_file": "/nonexistent/keys"}, "cannot read /nonexistent/keys"),
        ({"rate_limit_per_key": 5}, "--rate-limit-per-key needs API keys"),
        ({"cors_origins": ["*"], "cors_allow_credentials": True}, "'*' must stand alone"),
        ({"cors_origins": ["*", ORIGIN]}, "'*' must stand alone"),
    ],
)
def test_invalid_security_settings_fail_at_start(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        load_config(**settings)


def test_empty_key_file_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="holds no key"):
        load_config(api_key_file=str(tmp_path / "keys"))


def test_open_paths_follow_the_flags() -> None:
    assert not Service({}, load_config()).requires_auth("/v1/models")  # no keys: nothing is checked
    service = Service({}, load_config(api_keys=[KEY_FLAG]))
    assert [service.requires_auth(p) for p in ("/v2/health/live", "/v2/health/ready", "/metrics")] == [False] * 3
    assert service.requires_auth("/openapi.json") and service.requires_auth("/docs")
    assert service.requires_auth("/v1/models") and service.requires_auth("/anything")
    strict = Service({}, load_config(api_keys=[KEY_FLAG], metrics_auth=True, public_docs=True))
    assert strict.requires_auth("/metrics") and not strict.requires_auth("/docs")
    assert not strict.requires_auth("/openapi.json")


def test_cors_policy() -> None:
    policy = CorsPolicy([ORIGIN], allow_credentials=True, max_age=60)
    granted = policy.preflight(ORIGIN, "POST", "Authorization, content-type, X-Request-ID")
    assert granted["Access-Control-Allow-Origin"] == ORIGIN
    assert granted["Access-Control-Allow-Credentials"] == "true"
    assert granted["Access-Control-Max-Age"] == "60" and granted["Vary"] == "Origin"
    assert set(granted["Access-Control-Allow-Headers"].split(", ")) == set(ALLOWED_HEADERS)
    for origin, method, headers, fragment in [
        ("https://evil.example", "POST", None, "origin"),
        (ORIGIN, "DELETE", None, "method"),
        (ORIGIN, "POST", "x-custom", "request header 'x-custom'"),
    ]:
        with pytest.raises(CorsRejected, match=fragment):
            policy.preflight(origin, method, headers)
    assert policy.response_headers("https://evil.example") == {"Vary": "Origin"}
    assert policy.response_headers(ORIGIN)["Access-Control-Allow-Origin"] == ORIGIN
    anyone = CorsPolicy(["*"])
    assert anyone.response_headers("https://x.example")["Access-Control-Allow-Origin"] == "*"
    assert "Vary" not in anyone.response_headers("https://x.example")
    assert "Access-Control-Allow-Credentials" not in anyone.preflight("https://x.example", "GET", None)


# -- real servers ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """One server per architecture with keys from a flag and a file, CORS for one origin."""
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    key_file.write_text(f"# test keys\n{KEY_FILE}\n{KEY_LIMITED}\n{KEY_SOCKET}\n{KEY_STREAM}\n")

    def make(arch: str) -> Server:
        return Server(
            ["twinserve.examples.tabular:Classifier", model_path("Echo"), "twinserve.examples.tokens:Tokens"],
            arch,
            "--workers",
            "1",
            "--api-key",
            KEY_FLAG,
            "--api-key-file",
            str(key_file),
            "--rate-limit-per-key",
            "5",
            "--cors-origins",
            ORIGIN,
            # These tests send many wrong keys from one address on purpose: the lockout that would answer them
            # 429 has its own tests (tests/live/hardening/test_hostile_access.py).
            "--auth-failures-per-minute",
            "0",
        )

    with servers_per_arch(ARCHS, make) as started:
        yield started


@pytest.fixture(params=ARCHS)
def secure_server(request: pytest.FixtureRequest, secured: dict[str, Server]) -> Server:
    return secured[request.param]


def _predict(server: Server, headers: dict[str, str], path: str = "/v1/models/iris:predict") -> httpx.Response:
    return HTTP.post(server.url + path, json={"instances": [IRIS]}, headers=headers, timeout=30)


def test_a_key_from_each_source_in_each_header(secure_server: Server) -> None:
    for key in (KEY_FLAG, KEY_FILE):
        for headers in ({"Authorization": f"Bearer {key}"}, {"X-API-Key": key}):
            response = _predict(secure_server, headers)
            assert response.status_code == 200, response.text
            assert response.json()["predictions"][0]["label"] == "setosa"


@pytest.mark.parametrize(
    ("headers", "challenge"),
    [
        ({}, 'Bearer realm="twinserve"'),
        ({"Authorization": "Bearer not-a-key"}, 'Bearer realm="twinserve", error="invalid_token"'),
        ({"X-API-Key": KEY_FLAG[:-1]}, 'Bearer realm="twinserve", error="invalid_token"'),
        ({"Authorization": f"Basic {KEY_FLAG}"}, 'Bearer realm="twinserve"'),
    ],
)
def test_missing_or_wrong_key_is_401_with_a_challenge(
    secure_server: Server, headers: dict[str, str], challenge: str
) -> None:
    for path in ("/v1/models/iris:predict", "/v1/models", "/v1/models/iris", "/openapi.json", "/docs", "/nowhere"):
        response = HTTP.get(secure_server.url + path, headers=headers) if "predict" not in path else None
        response = response or _predict(secure_server, headers, path)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == challenge
        error = error_fields(response.json())
        assert error["code"] == "unauthorized" and error["request_id"] == response.headers["x-request-id"]
        assert KEY_FLAG[:-1] not in response.text
    v2 = HTTP.post(secure_server.url + "/v2/models/iris/infer", json={}, headers=headers)
    assert v2.status_code == 401 and v2.headers["www-authenticate"] == challenge
    assert list(v2.json()) == ["error"] and "API key" in v2.json()["error"]  # the V2 error body


def test_probes_and_scrapes_stay_open(secure_server: Server) -> None:
    assert HTTP.get(secure_server.url + "/v2/health/live").json() == {"live": True}
    assert HTTP.get(secure_server.url + "/v2/health/ready").json() == {"ready": True}
    assert HTTP.get(secure_server.url + "/metrics").status_code == 200


def test_openapi_declares_the_keys(secure_server: Server) -> None:
    doc = HTTP.get(secure_server.url + "/openapi.json", headers={"X-API-Key": KEY_FILE}).json()
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert doc["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert doc["security"] == [{"bearer": []}, {"apiKey": []}]
    assert doc["paths"]["/v2/health/ready"]["get"]["security"] == []
    assert "401" in doc["paths"]["/v1/models/iris:predict"]["post"]["responses"]
    assert "401" not in doc["paths"]["/v2/health/live"]["get"]["responses"]


def test_each_key_has_its_own_rate_limit(secure_server: Server) -> None:
    with httpx.Client(base_url=secure_server.url, timeout=30) as client:
        statuses = []
        for _ in range(60):
            response = client.get("/v1/models", headers={"X-API-Key": KEY_LIMITED})
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                assert error_fields(response.json())["code"] == "rate_limited"
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {200}
        assert len(statuses) > 5  # the burst (one second's worth) came first
        assert client.get("/v1/models", headers={"X-API-Key": KEY_FILE}).status_code == 200  # another key's bucket


def _cors_exchanges(server: Server) -> list[tuple[int, dict[str, str], Any]]:
    """Status, CORS-relevant headers and body (minus the request id) of one fixed set of cross-origin requests."""
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    requests: list[tuple[str, str, dict[str, str]]] = [
        ("OPTIONS", "/v1/models/iris:predict", {**preflight, "Access-Control-Request-Headers": "authorization"}),
        ("OPTIONS", "/v2/models/iris/infer", {**preflight, "Access-Control-Request-Headers": "content-type"}),
        ("OPTIONS", "/v1/models/iris:predict", {**preflight, "Origin": "https://evil.example"}),
        ("OPTIONS", "/v1/models/iris:predict", {**preflight, "Access-Control-Request-Method": "PUT"}),
        ("OPTIONS", "/v1/models/iris:predict", {**preflight, "Access-Control-Request-Headers": "x-secret"}),
        ("OPTIONS", "/v1/models", {"Origin": ORIGIN}),  # not a preflight: the route has no OPTIONS, and no key
        ("POST", "/v1/models/iris:predict", {"Origin": ORIGIN, "X-API-Key": KEY_FLAG}),
        ("POST", "/v1/models/iris:predict", {"Origin": ORIGIN}),
        ("GET", "/v1/models", {"Origin": "https://evil.example", "X-API-Key": KEY_FLAG}),
        ("GET", "/v2/health/live", {"Origin": ORIGIN}),
    ]
    seen = []
    for method, path, headers in requests:
        body = {"instances": [IRIS]} if method == "POST" else None
        response = HTTP.request(method, server.url + path, headers=headers, json=body, timeout=30)
        kept = {
            k: v
            for k, v in response.headers.items()
            if k.startswith("access-control-") or k in ("vary", "www-authenticate", "content-type", "allow")
        }
        content: Any = response.json() if response.content else None
        if isinstance(content, dict) and "error" in content:
            content = without_request_id(content)
        seen.append((response.status_code, kept, content))
    return seen


def test_cors_answers_are_identical_in_every_architecture(secured: dict[str, Server]) -> None:
    answers = {arch: _cors_exchanges(server) for arch, server in secured.items()}
    assert answers["async"] == answers["sync"] == answers["hybrid"]
    granted, v2_granted, bad_origin, bad_method, bad_header, not_preflight, ok, no_key, foreign, probe = answers["sync"]
    assert granted[0] == 204 and granted[2] is None and "content-type" not in granted[1]
    assert granted[1]["access-control-allow-origin"] == ORIGIN
    assert granted[1]["access-control-allow-methods"] == "GET, POST"
    assert "Authorization" in granted[1]["access-control-allow-headers"]
    assert v2_granted[0] == 204
    for refused in (bad_origin, bad_method, bad_header):
        assert refused[0] == 403 and error_fields(refused[2])["code"] == "cors_rejected"
        assert "access-control-allow-origin" not in refused[1]
    assert not_preflight[0] == 401  # OPTIONS without a preflight's headers is an ordinary request
    assert ok[0] == 200 and ok[1]["access-control-allow-origin"] == ORIGIN
    assert "X-Request-ID" in ok[1]["access-control-expose-headers"]
    assert no_key[0] == 401 and no_key[1]["access-control-allow-origin"] == ORIGIN  # the page can read the 401
    assert foreign[0] == 200 and "access-control-allow-origin" not in foreign[1] and foreign[1]["vary"] == "Origin"
    assert probe[0] == 200 and probe[1]["access-control-allow-origin"] == ORIGIN


def test_manifests_never_carry_keys() -> None:
    from twinserve.deploy.k8s import serve_command

    command = serve_command(load_config(api_keys=[KEY_FLAG], cors_origins=[ORIGIN, "https://b.example"]))
    assert KEY_FLAG not in " ".join(command)
    parsed = build_parser().parse_args(command[1:])
    assert load_config(cors_origins=parsed.cors_origins).cors_origins == [ORIGIN, "https://b.example"]


@pytest.mark.parametrize("arch", ["async", "hybrid"])
def test_websocket_handshakes_need_a_key(secured: dict[str, Server], arch: str) -> None:
    url = secured[arch].url.replace("http://", "ws://") + "/v1/models/iris/ws"

    async def run() -> None:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, additional_headers={"X-API-Key": "not-a-key"}):
                pass
        response = refused.value.response
        assert response.status_code == 401
        assert error_fields(json.loads(response.body or b""))["code"] == "unauthorized"
        async with connect(url, additional_headers={"Authorization": f"Bearer {KEY_FLAG}"}) as socket:
            await socket.send(json.dumps({"id": "a", "instances": [IRIS]}))
            answer = json.loads(await socket.recv())
        assert answer["id"] == "a" and answer["predictions"][0]["label"] == "setosa"

    asyncio.run(run())


@pytest.mark.parametrize("arch", ["async", "hybrid"])
def test_websocket_origin_and_per_key_rate_limit(secured: dict[str, Server], arch: str) -> None:
    url = secured[arch].url.replace("http://", "ws://") + "/v1/models/iris/ws"

    async def run() -> None:
        foreign = {"X-API-Key": KEY_FLAG, "Origin": "https://evil.example"}
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, additional_headers=foreign):
                pass
        assert refused.value.response.status_code == 403
        assert error_fields(json.loads(refused.value.response.body or b""))["code"] == "cors_rejected"
        # Each message is charged to the handshake's key (5 requests/s here): a burst of 20 is partly refused.
        async with connect(url, additional_headers={"X-API-Key": KEY_SOCKET, "Origin": ORIGIN}) as socket:
            for i in range(20):
                await socket.send(json.dumps({"id": str(i), "instances": [IRIS]}))
            answers = [json.loads(await socket.recv()) for _ in range(20)]
        limited = [a for a in answers if "error" in a]
        assert limited and all(error_fields(a)["code"] == "rate_limited" for a in limited)
        assert len(limited) < 20 and all(a["predictions"][0]["label"] == "setosa" for a in answers if a not in limited)

    asyncio.run(run())


def test_streams_carry_cors_headers_in_every_architecture(secured: dict[str, Server]) -> None:
    headers = {"X-API-Key": KEY_STREAM, "Origin": ORIGIN}
    body = {"instances": [{"text": "a b c", "max_tokens": 3}]}
    for arch, server in secured.items():
        with HTTP.stream("POST", server.url + "/v1/models/tokens:stream", json=body, headers=headers) as response:
            assert response.status_code == 200, arch
            assert response.headers["access-control-allow-origin"] == ORIGIN, arch
            assert response.headers["content-type"].startswith("text/event-stream"), arch
            response.read()
