"""A model repository (`--model-repository`, twinserve/repository/): its layout, version policy, per-model settings
from `twinserve.toml`, several versions live at once, and bad content that leaves the other models serving; in
process, in every architecture (tests/inprocess.py), over model files the tests write."""

from __future__ import annotations

import logging
import shutil
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ARCHS
from tests.inprocess import ARCHS_IN_PROCESS, AsyncClient, SyncClient, served, served_per_arch
from tests.serving import HTTP, Server, poll, wait_until
from twinserve.config import load_config
from twinserve.errors import ConfigError
from twinserve.repository import ModelRegistry, read_model, read_repository

Client = SyncClient | AsyncClient

#: A model whose answer says which version computed it; HELPER beside it is read by path.
VERSIONED = textwrap.dedent(
    """
    from pathlib import Path

    import twinserve


    class Scaler(twinserve.Model):
        def load(self):
            self.factor = int((Path(__file__).parent / "factor.txt").read_text())

        def predict(self, batch: list[int]) -> list[dict]:
            return [{"value": x * self.factor, "version": self.factor} for x in batch]
    """
)
PLAIN = "class Plain:\n    def predict(self, batch):\n        return [x + 100 for x in batch]\n"
RAISES = textwrap.dedent(
    """
    class Broken:
        def load(self):
            raise RuntimeError("no weights here")

        def predict(self, batch):
            return batch
    """
)


#: What a model's code may put in an exception's text: it belongs to the log, never to a client (issue #44).
SECRET = "token IMPORTTOKEN-abc123 rejected by https://vault.internal"
LEAKS = textwrap.dedent(
    f"""
    raise RuntimeError({SECRET!r})
    """
)
LOAD_LEAKS = RAISES.replace("no weights here", SECRET)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _versions(model: Path, toml: str, numbers: tuple[int, ...]) -> None:
    _write(model / "twinserve.toml", toml)
    for number in numbers:
        _write(model / str(number) / "model.py", VERSIONED)
        _write(model / str(number) / "factor.txt", str(number))


def make_repository(root: Path) -> Path:
    _versions(root / "scaler", 'model = "model.py:Scaler"\n[settings]\nmax_batch_size = 4\nmax_queue = 16\n', (1, 2))
    _versions(root / "latest", 'model = "model.py:Scaler"\nversions = {latest = 2}\n', (1, 2, 3))
    _versions(root / "specific", 'model = "model.py:Scaler"\nversions = {specific = [1, 3]}\n', (1, 2, 3))
    _write(root / "flat" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(root / "flat" / "model.py", PLAIN)
    _write(root / "missing-class" / "twinserve.toml", 'model = "model.py:Nope"\n')
    _write(root / "missing-class" / "model.py", PLAIN)
    _write(root / "syntax" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(root / "syntax" / "1" / "model.py", "class Plain(:\n")
    _write(root / "load-raises" / "twinserve.toml", 'model = "model.py:Broken"\n')
    _write(root / "load-raises" / "model.py", RAISES)
    _write(root / "no-toml" / "model.py", PLAIN)
    _write(root / "server-setting" / "twinserve.toml", 'model = "model.py:Plain"\n[settings]\nport = 9000\n')
    _write(root / "server-setting" / "model.py", PLAIN)
    _write(root / "import-raises" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(root / "import-raises" / "model.py", LEAKS)
    _write(root / "load-leaks" / "twinserve.toml", 'model = "model.py:Broken"\n')
    _write(root / "load-leaks" / "model.py", LOAD_LEAKS)
    _write(root / ".hidden" / "model.py", PLAIN)
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="module")
def apps(repository: Path) -> Iterator[dict[str, Client]]:
    with served_per_arch([], model_repository=str(repository)) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


def _predict(app: Client, path: str, instances: list[int]) -> list[Any]:
    answer = app.request("POST", path, json={"instances": instances})
    assert answer.status == 200, answer.text
    return answer.json()["predictions"]  # type: ignore[no-any-return]


def _infer(app: Client, path: str, values: list[int]) -> list[dict[str, Any]]:
    body = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [len(values)], "data": values}]}
    answer = app.request("POST", path, json=body)
    assert answer.status == 200, answer.text
    return answer.json()["outputs"]  # type: ignore[no-any-return]


# -- the layout, read without importing anything ---------------------------------------------------------------
def test_layout_and_version_policy(repository: Path) -> None:
    folders = {folder.name: folder for folder in read_repository(repository)}
    assert ".hidden" not in folders
    assert [v.version for v in folders["scaler"].versions] == [1, 2]
    assert folders["scaler"].settings == {"max_batch_size": 4, "max_queue": 16}
    assert [v.version for v in folders["latest"].versions] == [2, 3]
    assert [v.version for v in folders["specific"].versions] == [1, 3]
    assert [(v.version, v.folder) for v in folders["flat"].versions] == [(1, repository / "flat")]
    assert folders["no-toml"].error is not None and "twinserve.toml: missing" in folders["no-toml"].error
    # Two versions' model.py never share one module.
    modules = {v.module for v in folders["scaler"].versions}
    assert len(modules) == 2


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('model = "model.py:Plain"\nversions = {latest = 0}\n', "versions must be"),
        ('model = "model.py:Plain"\nversions = {specific = [7]}\n', "versions.specific names [7]"),
        ('model = "model.py"\n', "`model` must name the class"),
        ('model = "model.py:Plain"\nreplicas = 3\n', "unknown key(s) replicas"),
        ("model = \n", "cannot be read"),
    ],
)
def test_a_bad_settings_file_names_its_problem(tmp_path: Path, toml: str, message: str) -> None:
    _write(tmp_path / "m" / "twinserve.toml", toml)
    error = read_model(tmp_path / "m").error
    assert error is not None and message in error


def test_repository_and_model_arguments_are_exclusive(repository: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exclusive"):
        load_config(models=["twinserve.examples.tokens:Tokens"], model_repository=str(repository))
    with pytest.raises(ConfigError, match="is not a folder"):
        load_config(model_repository=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="--model-control needs --model-repository"):
        load_config(model_control="explicit")


# -- serving, in every architecture -------------------------------------------------------------------------
def test_the_default_version_is_the_highest(app: Client) -> None:
    assert _predict(app, "/v1/models/scaler:predict", [5]) == [{"value": 10, "version": 2}]
    assert _predict(app, "/v1/models/latest:predict", [5]) == [{"value": 15, "version": 3}]
    assert _predict(app, "/v1/models/specific:predict", [5]) == [{"value": 15, "version": 3}]
    assert app.request("GET", "/v2/models/scaler").json()["versions"] == ["1", "2"]  # Triton's: every version
    meta = app.request("GET", "/v1/models/scaler").json()
    assert meta["version"] == "2"
    assert [(v["version"], v["state"]) for v in meta["versions"]] == [("1", "READY"), ("2", "READY")]


def test_each_version_answers_its_own_route(app: Client) -> None:
    assert _predict(app, "/v1/models/scaler/versions/1:predict", [5]) == [{"value": 5, "version": 1}]
    assert _predict(app, "/v1/models/scaler/versions/2:predict", [5]) == [{"value": 10, "version": 2}]
    assert _predict(app, "/v1/models/specific/versions/1:predict", [2]) == [{"value": 2, "version": 1}]
    ready = app.request("GET", "/v2/models/scaler/versions/1/ready")
    assert ready.status == 200 and ready.json() == {"name": "scaler", "ready": True}
    assert app.request("GET", "/v2/models/scaler/versions/1").json()["versions"] == ["1"]
    scrape = app.request("GET", "/metrics").text  # each version's answers are counted apart
    for version in ("1", "2"):
        assert f'twinserve_version_requests_total{{model="scaler",outcome="ok",version="{version}"}}' in scrape
        assert f'twinserve_version_request_duration_seconds_count{{model="scaler",version="{version}"}}' in scrape


def test_a_version_the_policy_leaves_out_is_not_served(app: Client) -> None:
    for path in ("/v1/models/latest/versions/1:predict", "/v1/models/specific/versions/2:predict"):
        answer = app.request("POST", path, json={"instances": [1]})
        assert answer.status == 404 and "has no version" in answer.text
    assert app.request("GET", "/v2/models/scaler/versions/9/ready").status == 404


def test_a_flat_model_folder_is_version_1(app: Client) -> None:
    assert _predict(app, "/v1/models/flat:predict", [1]) == [101]
    assert _predict(app, "/v1/models/flat/versions/1:predict", [1]) == [101]


def test_settings_file_settings_apply_to_every_version(app: Client) -> None:
    for path in ("/v1/models/scaler", "/v1/models/flat"):
        serving = app.request("GET", path).json()["serving"]
        expected = (4, 16) if path.endswith("scaler") else ((1 if app.arch == "sync" else 32), 1024)
        assert (serving["max_batch_size"], serving["settings"]["max_queue"]) == expected
    assert app.request("GET", "/v2/models/scaler/versions/1/config").json()["max_batch_size"] == 4


#: What clients read of each failure: its kind, never its text (issue #44; before, the import's and the settings
#: file's text, with the server's paths, was in the index, the load answer and every 503).
BAD = {
    "missing-class": "version 1: its code failed to import (ModelImportError)",
    "syntax": "version 1: its code failed to import (SyntaxError)",
    "import-raises": "version 1: its code failed to import (RuntimeError)",
    "load-raises": "version 1: its load() failed",
    "load-leaks": "version 1: its load() failed",
    "no-toml": "its twinserve.toml cannot be used",
    "server-setting": "its twinserve.toml cannot be used",
}
#: What the log holds of each (test_the_log_has_what_clients_are_not_told).
LOGGED = {
    "missing-class": "no class 'Nope'",
    "syntax": "line 1",  # where it is
    "import-raises": SECRET,
    "no-toml": "twinserve.toml: missing",
    "server-setting": "'port' is a server-wide setting",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_content_makes_that_model_unavailable_and_the_others_serve(
    app: Client, name: str, repository: Path
) -> None:
    answer = app.request("POST", f"/v1/models/{name}:predict", json={"instances": [1]})
    assert answer.status == 503, answer.text
    body = answer.json()
    assert body["code"] == "model_unavailable" and BAD[name] in body["error"], body
    assert "the server log has the details" in body["error"]
    index = {entry["name"]: entry for entry in app.request("POST", "/v2/repository/index", json={}).json()}
    reason = index[name]["reason"]
    assert index[name]["state"] == "UNAVAILABLE" and BAD[name].removeprefix("version 1: ") in reason, reason
    for text in (answer.text, str(index[name])):
        assert "IMPORTTOKEN" not in text and str(repository) not in text and LOGGED.get(name, "\0") not in text
    assert _predict(app, "/v1/models/flat:predict", [1]) == [101]


def test_the_log_has_what_clients_are_not_told(repository: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Imports and settings files are read in the server process in every architecture (the index is built there).
    with caplog.at_level(logging.ERROR, logger="twinserve.repository"):
        ModelRegistry.from_config(load_config(model_repository=str(repository)))
    logged = {record.getMessage() for record in caplog.records}
    for name, text in LOGGED.items():
        assert any(f"model {name!r}" in line and text in line for line in logged), (name, logged)


def test_the_index_lists_every_model_and_version(app: Client) -> None:
    index = app.request("POST", "/v2/repository/index", json={}).json()
    ready = sorted((e["name"], e["version"]) for e in index if e["state"] == "READY")
    assert ready == [
        ("flat", "1"),
        ("latest", "2"),
        ("latest", "3"),
        ("scaler", "1"),
        ("scaler", "2"),
        ("specific", "1"),
        ("specific", "3"),
    ]
    assert {e["name"] for e in index if e["state"] == "UNAVAILABLE"} == set(BAD)
    # The server is ready: the models that failed are reported in the index, not by the readiness probe.
    assert app.request("GET", "/v2/health/ready").status == 200
    assert set(app.request("GET", "/v1/models").json()["models"]) == {"flat", "latest", "scaler", "specific"}


def test_v2_inference_by_version(app: Client) -> None:
    for version in ("1", "2"):
        outputs = _infer(app, f"/v2/models/scaler/versions/{version}/infer", [3])
        assert f'"version":{version}' in str(outputs[0]["data"][0]).replace(" ", ""), outputs
    assert app.request("GET", "/v2/models/scaler/versions/1").json()["versions"] == ["1"]


# -- load and unload at run time (--model-control explicit) -----------------------------------------------------
ADMIN = "admin-key-0123456789abcdef"
USER = "user-key-0123456789abcdef"


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_explicit_control_loads_new_versions_and_unloads(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    _versions(root / "grow", 'model = "model.py:Scaler"\n', (1,))
    _write(root / "flat" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(root / "flat" / "model.py", PLAIN)
    with served(arch, [], model_repository=str(root), model_control="explicit", workers=1) as app:
        assert _predict(app, "/v1/models/grow:predict", [1]) == [{"value": 1, "version": 1}]
        # A new version folder is served once loaded, and becomes the default; the old one still answers.
        _versions(root / "grow", 'model = "model.py:Scaler"\n', (2,))
        loaded = app.request("POST", "/v2/repository/models/grow/load", json={})
        assert loaded.status == 200, loaded.text
        assert [(v["version"], v["state"]) for v in loaded.json()["versions"]] == [("1", "READY"), ("2", "READY")]
        assert _predict(app, "/v1/models/grow:predict", [1]) == [{"value": 2, "version": 2}]
        assert _predict(app, "/v1/models/grow/versions/1:predict", [1]) == [{"value": 1, "version": 1}]
        # Unloaded: unavailable, said so in the index; the other models serve on.
        assert app.request("POST", "/v2/repository/models/grow/unload", json={}).status == 200
        answer = app.request("POST", "/v1/models/grow:predict", json={"instances": [1]})
        assert answer.status == 503 and answer.json()["code"] == "model_unavailable"
        index = app.request("POST", "/v2/repository/index", json={}).json()
        assert {(e["name"], e["version"], e["state"], e["reason"]) for e in index if e["name"] == "grow"} == {
            ("grow", "1", "UNAVAILABLE", "unloaded"),
            ("grow", "2", "UNAVAILABLE", "unloaded"),
        }
        assert _predict(app, "/v1/models/flat:predict", [1]) == [101]
        # A fixed file is imported afresh on a load (the same size, the same second: no stale bytecode).
        _write(root / "flat" / "model.py", PLAIN.replace("100", "200"))
        assert app.request("POST", "/v2/repository/models/flat/load", json={}).status == 200
        assert _predict(app, "/v1/models/flat:predict", [1]) == [201]
        assert app.request("POST", "/v2/repository/models/grow/load", json={}).status == 200
        assert _predict(app, "/v1/models/grow:predict", [3]) == [{"value": 6, "version": 2}]
        # A model folder added after start loads on request; a broken one says why, and nothing else changes.
        _write(root / "late" / "twinserve.toml", 'model = "model.py:Plain"\n')
        _write(root / "late" / "model.py", PLAIN)
        assert app.request("POST", "/v2/repository/models/late/load", json={}).status == 200
        assert _predict(app, "/v1/models/late:predict", [1]) == [101]
        _write(root / "broken" / "twinserve.toml", 'model = "model.py:Broken"\n')
        _write(root / "broken" / "model.py", RAISES)
        failed = app.request("POST", "/v2/repository/models/broken/load", json={})
        assert failed.status == 503 and "its load() failed" in failed.text
        assert app.request("POST", "/v2/repository/models/nope/load", json={}).status == 404
        assert app.request("POST", "/v2/repository/models/nope/unload", json={}).status == 404
        assert _predict(app, "/v1/models/grow:predict", [3]) == [{"value": 6, "version": 2}]


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_only_the_admin_key_changes_the_repository(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    _write(root / "flat" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(root / "flat" / "model.py", PLAIN)
    keys = {"api_keys": [USER], "admin_api_key": ADMIN}
    with served(arch, [], model_repository=str(root), model_control="explicit", workers=1, **keys) as app:
        path = "/v2/repository/models/flat/unload"
        refused = app.request("POST", path, json={}, headers={"Authorization": f"Bearer {USER}"})
        assert refused.status == 403 and "admin API key" in refused.json()["error"]
        assert app.request("POST", path, json={}).status == 401
        # Any key reads the index; the admin key is a key like the others for everything else.
        index = app.request("POST", "/v2/repository/index", json={}, headers={"X-API-Key": USER})
        assert index.status == 200
        admin = {"Authorization": f"Bearer {ADMIN}"}
        answer = app.request("POST", "/v1/models/flat:predict", json={"instances": [1]}, headers=admin)
        assert answer.status == 200
        assert app.request("POST", path, json={}, headers=admin).status == 200


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_poll_control_follows_the_folder(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    _versions(root / "grow", 'model = "model.py:Scaler"\n', (1,))
    _write(root / "flat" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(root / "flat" / "model.py", PLAIN)
    with served(arch, [], model_repository=str(root), model_control="poll", repository_poll_s=0.05) as app:

        def states(name: str) -> set[tuple[str, str]]:
            index = app.request("POST", "/v2/repository/index", json={}).json()
            return {(e["version"], e["state"]) for e in index if e["name"] == name}

        assert _predict(app, "/v1/models/grow:predict", [1]) == [{"value": 1, "version": 1}]
        # A new version, moved in whole (as docs/repository.md advises for poll: a folder half copied may be read
        # half written): loaded, then the default.
        _versions(tmp_path / "staging", 'model = "model.py:Scaler"\n', (2,))
        (tmp_path / "staging" / "2").rename(root / "grow" / "2")
        wait_until(lambda: states("grow") == {("1", "READY"), ("2", "READY")})
        assert _predict(app, "/v1/models/grow:predict", [1]) == [{"value": 2, "version": 2}]
        shutil.rmtree(root / "flat")  # a removed model: unloaded
        wait_until(lambda: states("flat") == {("1", "UNAVAILABLE")})
        assert app.request("POST", "/v1/models/flat:predict", json={"instances": [1]}).status == 503
        # The folder is the control: the API's load and unload are refused.
        refused = app.request("POST", "/v2/repository/models/grow/unload", json={})
        assert refused.status == 400 and "--model-control poll" in refused.text


def test_unload_drains_the_requests_inside_first(tmp_path: Path) -> None:
    from twinserve.repository import ModelRegistry
    from twinserve.repository.control import ModelControl

    _write(tmp_path / "flat" / "twinserve.toml", 'model = "model.py:Plain"\n')
    _write(tmp_path / "flat" / "model.py", PLAIN)
    config = load_config(model_repository=str(tmp_path), model_control="explicit", workers=1)
    registry = ModelRegistry.from_config(config)
    registry.load()
    runtime = registry.runtime("flat")
    assert runtime.occupancy.enter()  # a request inside the model
    unloading = threading.Thread(target=ModelControl(registry).unload, args=("flat",))
    unloading.start()
    wait_until(lambda: not runtime.occupancy.accepting)  # admission stopped...
    assert not runtime.occupancy.enter() and runtime.ready and unloading.is_alive()  # ...the model stays open
    assert runtime.predict([1]) == [101]
    runtime.occupancy.leave()
    unloading.join(timeout=30)
    assert not unloading.is_alive() and not runtime.ready
    assert [e.state for e in registry.versions_of("flat")] == ["UNAVAILABLE"]


# -- real servers, several processes ---------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_every_server_process_serves_the_same_repository(tmp_path: Path, arch: str) -> None:
    """Each server process reads the repository at start, and with --model-control poll watches it: all of them
    serve the same versions and report the same index, whichever answers, before and after a change."""
    root = tmp_path / "repository"
    _versions(root / "scaler", 'model = "model.py:Scaler"\n', (1, 2))
    _write(root / "broken" / "twinserve.toml", 'model = "model.py:Broken"\n')
    _write(root / "broken" / "model.py", RAISES)
    flags = ("--model-repository", str(root), "--workers", "2", "--model-control", "poll", "--repository-poll-s", "0.2")
    with Server([], arch, *flags) as server:

        def answers() -> set[tuple[Any, ...]]:
            """What a round of requests, on new connections (so either process may take each), was answered."""
            seen = set()
            for _ in range(12):
                answer = HTTP.post(f"{server.url}/v1/models/scaler:predict", json={"instances": [1]}, timeout=30)
                assert answer.status_code == 200
                index = HTTP.post(f"{server.url}/v2/repository/index", json={}, timeout=30).json()
                seen.add(
                    (
                        answer.json()["predictions"][0]["version"],
                        *((e["name"], e["version"], e["state"]) for e in index),
                    )
                )
            return seen

        before = ("broken", "1", "UNAVAILABLE"), ("scaler", "1", "READY"), ("scaler", "2", "READY")
        first = answers()
        assert first == {(2, *before)}, f"{first}\n{server.log_tail(80)}"  # the reason, if a version failed to load
        _versions(root / "scaler", 'model = "model.py:Scaler"\n', (3,))
        after = (3, *before, ("scaler", "3", "READY"))
        seen: list[set[tuple[Any, ...]]] = []

        def changed() -> bool:
            seen.append(answers())
            return seen[-1] == {after}

        assert poll(changed, timeout=120), f"after the change, still answered {seen[-1]}\n{server.log_tail(60)}"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_server_process_follows_an_explicit_load_and_unload(tmp_path: Path, arch: str) -> None:
    """A load or unload reaches one server process; the others follow it through the shared desired state."""
    root = tmp_path / "repository"
    _versions(root / "scaler", 'model = "model.py:Scaler"\n', (1,))
    flags = ("--model-repository", str(root), "--workers", "2", "--model-control", "explicit")
    with Server([], arch, *flags) as server:

        def answers() -> set[tuple[int, Any]]:
            """(status, version) of a round of requests on new connections, so either process may take each."""
            seen = set()
            for _ in range(12):
                answer = HTTP.post(f"{server.url}/v1/models/scaler:predict", json={"instances": [1]}, timeout=30)
                version = answer.json()["predictions"][0]["version"] if answer.status_code == 200 else None
                seen.add((answer.status_code, version))
            return seen

        assert answers() == {(200, 1)}
        _versions(root / "scaler", 'model = "model.py:Scaler"\n', (2,))
        assert HTTP.post(f"{server.url}/v2/repository/models/scaler/load", json={}, timeout=120).status_code == 200
        wait_until(lambda: answers() == {(200, 2)}, timeout=120)
        assert HTTP.post(f"{server.url}/v2/repository/models/scaler/unload", json={}, timeout=120).status_code == 200
        wait_until(lambda: answers() == {(503, None)}, timeout=120)


def test_a_websocket_follows_its_models_reload_and_unload(tmp_path: Path) -> None:
    """Each WebSocket message is admitted like a request: to the model's default version of the moment."""
    from starlette.testclient import TestClient

    from twinserve.fronts.asgi import create_asgi_app
    from twinserve.repository import ModelRegistry
    from twinserve.service.contract import Service

    _versions(tmp_path / "grow", 'model = "model.py:Scaler"\n', (1,))
    config = load_config(arch="async", model_repository=str(tmp_path), model_control="explicit", workers=1)
    app = create_asgi_app(Service(ModelRegistry.from_config(config), config))
    with TestClient(app) as client, client.websocket_connect("ws://localhost/v1/models/grow/ws") as websocket:
        websocket.send_text('{"id": "a", "instances": [1]}')
        assert websocket.receive_json() == {"id": "a", "predictions": [{"value": 1, "version": 1}]}
        _versions(tmp_path / "grow", 'model = "model.py:Scaler"\n', (2,))
        assert client.post("http://localhost/v2/repository/models/grow/load", json={}).status_code == 200
        websocket.send_text('{"id": "b", "instances": [1]}')
        assert websocket.receive_json() == {"id": "b", "predictions": [{"value": 2, "version": 2}]}
        assert client.post("http://localhost/v2/repository/models/grow/unload", json={}).status_code == 200
        websocket.send_text('{"id": "c", "instances": [1]}')
        answer = websocket.receive_json()
        assert answer["id"] == "c" and "model_unavailable" in str(answer["error"])
