"""The routes that change what the server serves (repository load, unload, traffic) against hostile requests, in
every architecture, in process: cross-site requests (service/hosts.py `check_site`; docs/security.md "Cross-site
requests"), and names and bodies no folder or policy could be (4xx, never a 500); and what a traffic change keeps.

A page on another site can make a browser send, with no CORS preflight (Fetch standard, "CORS-safelisted request
header": `Content-Type` one of `application/x-www-form-urlencoded`, `multipart/form-data`, `text/plain`, or none),
a bodiless `fetch(url, {method: "POST", mode: "no-cors"})`, a `<form>` POST, or a `text/plain` body holding JSON.
It cannot read the answer, but the request acts. Browsers send `Origin` on every such POST (Fetch standard,
"append a request `Origin` header"), and `Sec-Fetch-Site` (Fetch Metadata) says whether it came from another site.
So without API keys (anyone may load and unload then: docs/security.md) a foreign Origin is refused with 403
`cross_site`, unless `--cors-origins` allows it; programs send no Origin and are not affected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.inprocess import ARCHS_IN_PROCESS, Answer, AsyncClient, SyncClient, served_per_arch

Client = SyncClient | AsyncClient

ALLOWED = "https://app.example"
EVIL = {"Origin": "https://evil.example"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TEXT = {"Content-Type": "text/plain;charset=UTF-8"}
UNLOAD, LOAD = "/v2/repository/models/scaler/unload", "/v2/repository/models/scaler/load"
TRAFFIC = "/v2/repository/models/scaler/traffic"
NO_TRAFFIC: dict[str, object] = {"split": {}, "sticky_header": None, "shadow": None}
MODEL = "import twinserve\n\n\nclass Scaler(twinserve.Model):\n    def predict(self, batch):\n        return batch\n"


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Client]]:
    root = tmp_path_factory.mktemp("repository")
    for version in ("1", "2"):
        (root / "scaler" / version).mkdir(parents=True)
        (root / "scaler" / version / "model.py").write_text(MODEL)
    (root / "scaler" / "twinserve.toml").write_text('model = "model.py:Scaler"\n')
    settings = {"model_repository": str(root), "model_control": "explicit", "workers": 1, "cors_origins": [ALLOWED]}
    with served_per_arch([], **settings) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Iterator[Client]:
    client = apps[request.param]
    yield client
    # Each test starts from the model loaded and its default traffic: loaded again only after a test that changed
    # either (a load imports the model anew; hybrid starts its model worker again).
    if not _serving(client) or client.request("GET", TRAFFIC).json()["traffic"] != NO_TRAFFIC:
        assert client.request("POST", LOAD).status == 200


def _refused(answer: Answer) -> str:
    """The V2 error body of a 403 `cross_site` (the code is in the log and metrics; V2 bodies carry the message)."""
    assert answer.status == 403, answer.text
    message: str = answer.json()["error"]
    assert "another site" in message and "--cors-origins" in message, message
    return message


def _serving(app: Client) -> bool:
    return app.request("GET", "/v2/models/scaler/ready").status == 200


@pytest.mark.parametrize(
    ("path", "content", "headers"),
    [
        (UNLOAD, None, {}),  # fetch(..., {method: "POST", mode: "no-cors"}): no body, no type
        (UNLOAD, b"x=1", FORM),  # <form method=post>
        (LOAD, b"{}", TEXT),  # <form enctype=text/plain>, or fetch with a string body
        (TRAFFIC, b'{"split": {"1": 100}}', TEXT),
    ],
    ids=["no-cors-fetch", "form", "text-load", "text-traffic"],
)
def test_a_foreign_origin_cannot_change_the_models(
    app: Client, path: str, content: bytes | None, headers: dict[str, str]
) -> None:
    _refused(app.request("POST", path, content=content, headers={**headers, **EVIL}))
    assert _serving(app)
    assert app.request("GET", TRAFFIC).json()["traffic"]["split"] == {}  # unchanged


@pytest.mark.parametrize("origin", ["null", "http://evil.example:8000", "https://app.example.evil.example"])
def test_other_foreign_origins_are_refused_too(app: Client, origin: str) -> None:
    # `null`: a sandboxed frame or a file; an origin's port or a longer name is another origin.
    _refused(app.request("POST", UNLOAD, headers={"Origin": origin}))
    assert _serving(app)


def test_fetch_metadata_without_an_origin_is_refused(app: Client) -> None:
    # A proxy that strips Origin still passes Sec-Fetch-Site, which only a browser sends.
    _refused(app.request("POST", UNLOAD, headers={"Sec-Fetch-Site": "cross-site"}))
    assert _serving(app)


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a program (curl, tritonclient): no Origin
        {"Origin": ALLOWED, "Sec-Fetch-Site": "cross-site"},  # a page --cors-origins allows
        {"Origin": "http://127.0.0.1:8000", "Host": "127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},  # typed into the address bar, or a bookmark
    ],
    ids=["program", "cors-allowed", "same-origin", "fetch-same-origin", "fetch-none"],
)
def test_the_server_itself_its_allowed_origins_and_programs_may(app: Client, headers: dict[str, str]) -> None:
    assert app.request("POST", UNLOAD, headers=headers).status == 200
    assert not _serving(app)
    changed = app.request("POST", TRAFFIC, json={"split": {"1": 100}}, headers=headers)
    assert changed.status == 200, changed.text
    assert app.request("POST", LOAD, json={}, headers=headers).status == 200


@pytest.mark.parametrize("headers", [FORM, TEXT, {"Content-Type": "multipart/form-data; boundary=x"}])
def test_state_changing_routes_take_json_only(app: Client, headers: dict[str, str]) -> None:
    # Not from a page (no Origin): 415, as for :predict; a JSON body from a page needs a preflight first.
    answer = app.request("POST", TRAFFIC, content=b'{"split": {"1": 100}}', headers=headers)
    assert answer.status == 415, answer.text
    assert app.request("GET", TRAFFIC).json()["traffic"]["split"] == {}


def test_a_cross_site_form_to_predict_is_refused_the_same_way(app: Client) -> None:
    # :predict reads a form-typed body as JSON for `curl -d` (tests/contract/test_v1_rest.py), never from a page.
    answer = app.request("POST", "/v1/models/scaler:predict", content=b'{"instances": [1]}', headers={**FORM, **EVIL})
    assert answer.status == 403 and answer.json()["code"] == "cross_site", answer.text
    fetched = app.request(
        "POST", "/v2/models/scaler/infer", content=b"{}", headers={**TEXT, "Sec-Fetch-Site": "cross-site"}
    )
    assert fetched.status == 403, fetched.text


def test_reading_is_not_a_change(app: Client) -> None:
    # The index and a traffic read change nothing; a page cannot read their answers without a CORS grant.
    assert app.request("POST", "/v2/repository/index", headers=EVIL).status == 200
    assert app.request("GET", TRAFFIC, headers=EVIL).status == 200


def test_every_architecture_refuses_alike(apps: dict[str, Client]) -> None:
    answers = {arch: app.request("POST", UNLOAD, headers=EVIL) for arch, app in apps.items()}
    assert {arch: a.status for arch, a in answers.items()} == dict.fromkeys(ARCHS_IN_PROCESS, 403)
    assert len({a.json()["error"] for a in answers.values()}) == 1


# -- names and bodies no folder or policy could be ----------------------------------------------------------------
def test_a_name_longer_than_any_folder_is_404(app: Client) -> None:
    # 3,000 characters: the folder lookup raised OSError (file name too long), a 500 (issue #44).
    for path in (f"/v2/repository/models/{'m' * 3000}/load", f"/v2/repository/models/{'m' * 3000}/unload"):
        answer = app.request("POST", path)
        assert answer.status == 404, answer.text
    assert _serving(app)


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"split": {"1": NaN}}', b'{"split": {"1": Infinity, "2": 1}}'],
    ids=["nested-100k", "nan", "infinity"],
)
def test_a_traffic_body_no_policy_could_be_is_400(app: Client, body: bytes) -> None:
    # Deep nesting raised RecursionError, a 500; an infinite weight took every request (issue #44).
    answer = app.request("POST", TRAFFIC, content=body, headers={"Content-Type": "application/json"})
    assert answer.status == 400, answer.text
    assert app.request("GET", TRAFFIC).json()["traffic"]["split"] == {}


# -- what a traffic change keeps ---------------------------------------------------------------------------------
def test_a_traffic_change_keeps_the_parts_it_does_not_name(app: Client) -> None:
    """`{"split": ...}` alone used to drop a configured shadow without a word (issue #43): each part the body names
    is replaced, `null` removes one, the others stay, and the answer is the whole policy in force."""

    def change(body: dict[str, object]) -> dict[str, object]:
        answer = app.request("POST", TRAFFIC, json=body)
        assert answer.status == 200, answer.text
        in_force: dict[str, object] = answer.json()["traffic"]
        assert app.request("GET", TRAFFIC).json()["traffic"] == in_force
        return in_force

    whole: dict[str, object] = {
        "split": {"1": 1, "2": 3},
        "sticky_header": "X-Session-Id",
        "shadow": {"version": "1", "share": 0.5},
    }
    assert change(whole) == whole
    assert change({"split": {"2": 100}}) == {**whole, "split": {"2": 100}}  # replaced whole, not merged
    assert change({}) == {**whole, "split": {"2": 100}}
    assert change({"shadow": None}) == {"split": {"2": 100}, "sticky_header": "X-Session-Id", "shadow": None}
    assert change({"split": None, "sticky_header": None}) == NO_TRAFFIC
    assert app.request("POST", TRAFFIC, json={"split": {"9": 1}}).status == 400  # refused whole: nothing changes
    assert app.request("GET", TRAFFIC).json()["traffic"] == NO_TRAFFIC
