"""Traffic split and shadow served (docs/repository.md "Traffic split and shadow"): the `[traffic]` table of a
repository model spreads its unversioned requests over its versions, sticky by a header when asked, and mirrors a
share to a shadow version whose answers are only compared; the repository API changes it at run time, in every
server process. In process over every architecture (tests/inprocess.py), then real servers with two processes."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ARCHS
from tests.inprocess import ARCHS_IN_PROCESS, AsyncClient, SyncClient, served, served_per_arch
from tests.live.test_traffic import within_bounds
from tests.serving import HTTP, Server, wait_until

Client = SyncClient | AsyncClient

#: Answers with the version that computed it (its folder's number, read by path).
NUMBERED = textwrap.dedent(
    """
    from pathlib import Path

    import twinserve


    class Numbered(twinserve.Model):
        def load(self):
            self.number = int(Path(__file__).parent.name)

        def predict(self, batch: list[int]) -> list[dict]:
            return [{"value": x * self.number, "version": self.number} for x in batch]
    """
)
#: Every version answers alike, once the file `open` beside it exists (a test holds a shadow back with it).
GATED = textwrap.dedent(
    """
    import time
    from pathlib import Path


    class Gated:
        def predict(self, batch):
            gate = Path(__file__).parent / "open"
            deadline = time.monotonic() + 60
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return [x + 100 for x in batch]
    """
)
ADMIN = "admin-key-0123456789abcdef"
USER = "user-key-0123456789abcdef"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _model(root: Path, toml: str, numbers: tuple[int, ...] = (1, 2), code: str = NUMBERED) -> None:
    _write(root / "twinserve.toml", toml)
    for number in numbers:
        _write(root / str(number) / "model.py", code)


def make_repository(root: Path) -> Path:
    # 80/20 by chance, or by the X-Session-Id header when a request has one.
    split = '[traffic]\nsplit = {"1" = 80, "2" = 20}\nsticky_header = "X-Session-Id"\n'
    _model(root / "split", 'model = "model.py:Numbered"\n' + split)
    # Version 1 answers everything; version 2 computes each request again, and answers differently.
    shadowed = '[traffic]\nsplit = {"1" = 1}\nshadow = {version = "2", share = 1.0}\n'
    _model(root / "shadowed", 'model = "model.py:Numbered"\n' + shadowed)
    # Version 2 shadows the default (2 is the highest, so 1), and agrees with it, once let through.
    _model(root / "agreeing", 'model = "model.py:Gated"\n[traffic]\nshadow = {version = "1"}\n', code=GATED)
    _write(root / "agreeing" / "1" / "open", "")
    _write(root / "agreeing" / "2" / "open", "")
    _model(root / "bad", 'model = "model.py:Numbered"\n[traffic]\nsplit = {"1" = 50, "9" = 50}\n', (1,))
    _model(root / "plain", 'model = "model.py:Numbered"\n', (1,))
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("traffic"))


@pytest.fixture(scope="module")
def apps(repository: Path) -> Iterator[dict[str, Client]]:
    with served_per_arch([], model_repository=str(repository)) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


def _predict(app: Client, path: str, instances: list[int], headers: dict[str, str] | None = None) -> list[Any]:
    answer = app.request("POST", path, json={"instances": instances}, headers=headers)
    assert answer.status == 200, answer.text
    return answer.json()["predictions"]  # type: ignore[no-any-return]


def _shadow_counts(app: Client, model: str) -> Counter[str]:
    """`twinserve_shadow_requests_total` of `model`, by outcome (this process's registry: every app here)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(app.request("GET", "/metrics").text):
        for sample in family.samples:
            if sample.name == "twinserve_shadow_requests_total" and sample.labels["model"] == model:
                counts[sample.labels["outcome"]] += int(sample.value)
    return counts


def _difference_count(app: Client, model: str) -> float:
    """How many latency differences `twinserve_shadow_latency_difference_seconds` observed for `model`."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(app.request("GET", "/metrics").text)
        for sample in family.samples
        if sample.name == "twinserve_shadow_latency_difference_seconds_count" and sample.labels["model"] == model
    )


# -- the split -------------------------------------------------------------------------------------------------
def test_the_split_is_within_binomial_bounds_and_each_answer_is_its_versions(app: Client) -> None:
    n = 200
    versions: Counter[int] = Counter()
    for i in range(n):
        (answer,) = _predict(app, "/v1/models/split:predict", [i])
        assert answer["value"] == i * answer["version"]  # computed by the version it says, none dropped
        versions[answer["version"]] += 1
    assert set(versions) <= {1, 2} and sum(versions.values()) == n
    assert within_bounds(versions[2], n, 0.2), versions
    # V2 names the version that answered, and it is the one that computed the outputs.
    body = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1], "data": [3]}]}
    for _ in range(20):
        answer = app.request("POST", "/v2/models/split/infer", json=body)
        assert answer.status == 200, answer.text
        reply = answer.json()
        (output,) = reply["outputs"][0]["data"]  # a dict travels as a JSON string (BYTES)
        assert json.loads(output)["version"] == int(reply["model_version"]), reply


def test_versioned_routes_ignore_the_split(app: Client) -> None:
    for _ in range(30):
        assert _predict(app, "/v1/models/split/versions/1:predict", [1]) == [{"value": 1, "version": 1}]
        assert _predict(app, "/v1/models/split/versions/2:predict", [1]) == [{"value": 2, "version": 2}]


def test_a_sticky_key_always_gets_the_same_version(app: Client) -> None:
    chosen: dict[str, set[int]] = {}
    for i in range(40):
        key = f"session-{i}"
        for _ in range(4):
            (answer,) = _predict(app, "/v1/models/split:predict", [1], headers={"X-Session-Id": key})
            chosen.setdefault(key, set()).add(answer["version"])
    assert all(len(versions) == 1 for versions in chosen.values()), chosen
    assert {v for versions in chosen.values() for v in versions} == {1, 2}  # the keys do spread


def test_a_bad_traffic_table_makes_that_model_unavailable_and_the_others_serve(app: Client) -> None:
    answer = app.request("POST", "/v1/models/bad:predict", json={"instances": [1]})
    assert answer.status == 503 and answer.json()["code"] == "model_unavailable"
    assert "its twinserve.toml cannot be used" in answer.text  # what is wrong with it is the log's (issue #44)
    index = app.request("POST", "/v2/repository/index", json={}).json()
    (bad,) = [e for e in index if e["name"] == "bad"]
    assert bad["state"] == "UNAVAILABLE" and "twinserve.toml" in bad["reason"]
    assert _predict(app, "/v1/models/plain:predict", [1]) == [{"value": 1, "version": 1}]


def test_the_traffic_reads_back_and_is_changed_only_under_explicit_control(app: Client) -> None:
    answer = app.request("GET", "/v2/repository/models/split/traffic")
    assert answer.status == 200
    assert answer.json() == {
        "name": "split",
        "traffic": {"split": {"1": 80, "2": 20}, "sticky_header": "X-Session-Id", "shadow": None},
    }
    assert app.request("GET", "/v2/repository/models/nope/traffic").status == 404
    refused = app.request("POST", "/v2/repository/models/split/traffic", json={"split": {"1": 1}})
    assert refused.status == 400 and "--model-control none" in refused.text


# -- shadow ----------------------------------------------------------------------------------------------------
def test_a_shadow_never_changes_the_primary_answer_and_its_disagreements_count(app: Client) -> None:
    before = _shadow_counts(app, "shadowed")
    n = 20
    for i in range(n):
        assert _predict(app, "/v1/models/shadowed:predict", [i, i + 1]) == [
            {"value": i, "version": 1},
            {"value": i + 1, "version": 1},
        ]
    wait_until(lambda: _shadow_counts(app, "shadowed")["disagree"] - before["disagree"] == n, timeout=60)
    after = _shadow_counts(app, "shadowed")
    assert after["agree"] == before["agree"] and after["error"] == before["error"]
    assert _difference_count(app, "shadowed") >= n  # each compared pair's latency difference observed
    assert after["dropped"] == before["dropped"]


def test_a_held_back_shadow_never_delays_the_primary_and_agrees_once_through(app: Client, repository: Path) -> None:
    gate = repository / "agreeing" / "1" / "open"
    gate.unlink(missing_ok=True)  # the shadow (version 1) computes nothing until the gate opens
    before = _shadow_counts(app, "agreeing")
    try:
        n = 6
        for i in range(n):  # answered while every shadow request waits
            assert _predict(app, "/v1/models/agreeing:predict", [i]) == [i + 100]
        assert _shadow_counts(app, "agreeing")["agree"] == before["agree"]
    finally:
        _write(gate, "")
    wait_until(lambda: _shadow_counts(app, "agreeing")["agree"] - before["agree"] == n, timeout=60)
    assert _shadow_counts(app, "agreeing")["disagree"] == before["disagree"]


# -- the API ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_the_api_changes_the_split(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    _model(root / "scaler", 'model = "model.py:Numbered"\n')
    keys = {"api_keys": [USER], "admin_api_key": ADMIN}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with served(arch, [], model_repository=str(root), model_control="explicit", workers=1, **keys) as app:
        path = "/v2/repository/models/scaler/traffic"

        def versions(count: int = 12) -> set[int]:
            return {_predict(app, "/v1/models/scaler:predict", [1], admin)[0]["version"] for _ in range(count)}

        assert versions() == {2}  # no split: the default
        assert app.request("GET", path, headers={"X-API-Key": USER}).status == 200
        refused = app.request("POST", path, json={"split": {"1": 1}}, headers={"X-API-Key": USER})
        assert refused.status == 403 and "admin API key" in refused.text
        # The repository's errors have the code and request id every other error has (issue #55).
        assert refused.json()["code"] == "forbidden" and refused.json()["request_id"] == refused.headers["x-request-id"]
        assert app.request("POST", path, json={"split": {"1": 1}}).status == 401
        changed = app.request("POST", path, json={"split": {"1": 1}}, headers=admin)
        assert changed.status == 200, changed.text
        assert changed.json()["traffic"]["split"] == {"1": 1}
        # The default version (2) now gets no unversioned request: said in the answer.
        assert changed.json()["warnings"] == [
            "model 'scaler': its default version 2 gets no unversioned request; the traffic split sends them to "
            "version 1"
        ]
        assert versions() == {1}
        drained = app.request("POST", path, json={"split": {"1": 0, "2": 1}}, headers=admin)  # 1 loaded, drained
        assert drained.status == 200 and "warnings" not in drained.json(), drained.text
        assert versions() == {2}
        assert app.request("POST", path, json={"split": {"1": 1}}, headers=admin).status == 200
        assert versions() == {1}
        assert app.request("GET", path, headers=admin).json()["traffic"]["split"] == {"1": 1}
        # A bad policy is refused and the old one stays.
        for bad in ({"split": {"7": 1}}, {"split": {"1": 0}}, {"shadow": {"version": "2", "share": 3}}, [1]):
            answer = app.request("POST", path, json=bad, headers=admin)
            assert answer.status == 400, answer.text
        assert (
            app.request("POST", path, content=b"{", headers={**admin, "Content-Type": "application/json"}).status == 400
        )
        assert versions() == {1}
        # A load reads the folder again, its [traffic] (none here) included.
        assert app.request("POST", "/v2/repository/models/scaler/load", json={}, headers=admin).status == 200
        assert versions() == {2}


# -- several server processes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_every_server_process_follows_a_traffic_change(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    traffic = '[traffic]\nsplit = {"2" = 1}\nshadow = {version = "1", share = 0.5}\n'
    _model(root / "scaler", 'model = "model.py:Numbered"\n' + traffic)
    flags = ("--model-repository", str(root), "--workers", "2", "--model-control", "explicit")
    with Server([], arch, *flags) as server:

        def answers() -> set[int]:
            """The versions a round of requests on new connections (so either process may take each) got."""
            seen = set()
            for _ in range(12):
                answer = HTTP.post(f"{server.url}/v1/models/scaler:predict", json={"instances": [1]}, timeout=30)
                assert answer.status_code == 200, answer.text
                seen.add(answer.json()["predictions"][0]["version"])
            return seen

        assert answers() == {2}
        url = f"{server.url}/v2/repository/models/scaler/traffic"
        assert HTTP.post(url, json={"split": {"1": 1}}, timeout=30).status_code == 200
        wait_until(lambda: answers() == {1}, timeout=120)
        # The change named the split alone: every process keeps the shadow (issue #43: it was dropped).
        kept = {"split": {"1": 1}, "sticky_header": None, "shadow": {"version": "1", "share": 0.5}}
        assert all(HTTP.get(url, timeout=30).json()["traffic"] == kept for _ in range(12))


# -- gRPC ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_grpc_calls_take_the_split_sticky_keys_and_the_shadow(tmp_path: Path, arch: str) -> None:
    """gRPC's ModelInfer without a version goes through the same lookup: split, sticky by metadata, shadowed."""
    import numpy as np
    import tritonclient.grpc as triton

    from tests.serving import free_port, sample, scrape

    root = tmp_path / "repository"
    shadowed = '[traffic]\nsplit = {"1" = 1}\nshadow = {version = "2", share = 1.0}\n'
    _model(root / "shadowed", 'model = "model.py:Numbered"\n' + shadowed)
    sticky = '[traffic]\nsplit = {"1" = 1, "2" = 1}\nsticky_header = "X-Session-Id"\n'
    _model(root / "sticky", 'model = "model.py:Numbered"\n' + sticky)
    port = free_port()
    with Server([], arch, "--model-repository", str(root), "--grpc-port", str(port)) as server:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:

            def infer(model: str, headers: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
                tensor = triton.InferInput("input", [1], "INT64")
                tensor.set_data_from_numpy(np.array([5], dtype=np.int64))
                result = client.infer(model, [tensor], headers=headers)
                (output,) = result.as_numpy("output")
                return result.get_response().model_version, json.loads(output)

            n = 10
            for _ in range(n):
                assert infer("shadowed") == ("1", {"value": 5, "version": 1})
            name = "twinserve_shadow_requests_total"
            labels = {"model": "shadowed", "primary": "1", "shadow": "2", "outcome": "disagree"}
            wait_until(lambda: sample(scrape(server), name, **labels) == n, timeout=120)
            for i in range(10):
                header = {"x-session-id": f"key-{i}"}
                answered = {infer("sticky", header)[0] for _ in range(3)}
                assert len(answered) == 1, answered
        finally:
            client.close()
