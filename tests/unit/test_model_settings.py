"""Per-model settings (core/settings.py): a model's own batch size, queue, timeout, cache, workers and default
priority over the server's flags, in every architecture, in process (tests/inprocess.py)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inprocess import ARCHS_IN_PROCESS, AsyncClient, SyncClient, served, served_per_arch
from twinserve.config import Config, load_config
from twinserve.core.runtime import ModelRuntime
from twinserve.core.settings import MODEL_SETTINGS, model_config
from twinserve.errors import ConfigError

Client = SyncClient | AsyncClient

MODELS = textwrap.dedent(
    """
    import time

    import twinserve


    class Tuned(twinserve.Model):
        name = "tuned"
        settings = {"max_batch_size": 4, "max_queue": 8, "default_priority": 2, "cache_size": 16, "timeout_ms": 9000}

        def predict(self, batch):
            return [x * 2 for x in batch]


    class Plain(twinserve.Model):
        name = "plain"

        def predict(self, batch):
            return [x + 1 for x in batch]


    class Slow(twinserve.Model):
        name = "slow"
        settings = {"timeout_ms": 1}

        def predict(self, batch):
            time.sleep(0.5)
            return list(batch)


    class ServerWide(twinserve.Model):
        settings = {"port": 9000}

        def predict(self, batch):
            return list(batch)


    class Threaded(twinserve.Model):
        settings = {"executor": "thread"}

        def predict(self, batch):
            return list(batch)
    """
)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("settings") / "tuned_models.py"
    path.write_text(MODELS)
    return path


@pytest.fixture(scope="module")
def apps(model_file: Path) -> Iterator[dict[str, Client]]:
    models = [f"{model_file}:{name}" for name in ("Tuned", "Plain", "Slow")]
    with served_per_arch(models, max_queue=64) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


def test_metadata_shows_each_models_own_settings(app: Client) -> None:
    tuned = app.request("GET", "/v1/models/tuned").json()["serving"]
    assert tuned["max_batch_size"] == 4
    assert {k: tuned["settings"][k] for k in ("max_queue", "default_priority", "cache_size", "timeout_ms")} == {
        "max_queue": 8,
        "default_priority": 2,
        "cache_size": 16,
        "timeout_ms": 9000,
    }
    assert tuned["cache"]["max_entries"] == 16
    plain = app.request("GET", "/v1/models/plain").json()["serving"]
    # The server's flags are the defaults: --max-queue 64, no cache, the architecture's batch size.
    assert plain["settings"]["max_queue"] == 64 and plain["settings"]["cache_size"] == 0 and "cache" not in plain
    assert plain["max_batch_size"] == (1 if app.arch == "sync" else 32)
    assert set(plain["settings"]) == set(MODEL_SETTINGS)


def test_triton_config_shows_each_models_own_batching_and_queue(app: Client) -> None:
    config = app.request("GET", "/v2/models/tuned/config").json()
    assert config["max_batch_size"] == 4
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    batching = config["dynamic_batching"]
    assert batching["default_queue_policy"] == {"max_queue_size": 8, "default_timeout_microseconds": 9_000_000}
    assert batching["default_priority_level"] == 2


def test_a_models_own_queue_bound_refuses_what_it_could_never_hold(app: Client) -> None:
    # 9 instances: more than `tuned`'s queue of 8 (413, as --max-instances follows the queue), fine for `plain`.
    assert app.request("POST", "/v1/models/tuned:predict", json={"instances": list(range(9))}).status == 413
    assert app.request("POST", "/v1/models/plain:predict", json={"instances": list(range(9))}).status == 200
    answer = app.request("POST", "/v1/models/tuned:predict", json={"instances": [1, 2]})
    assert answer.status == 200 and answer.json()["predictions"] == [2, 4]


def test_a_models_own_timeout_is_its_default_deadline(app: Client) -> None:
    assert app.request("POST", "/v1/models/slow:predict", json={"instances": [1]}).status == 504
    # A client's own deadline still wins over the model's.
    patient = {"X-Request-Timeout-Ms": "20000"}
    answer = app.request("POST", "/v1/models/slow:predict", json={"instances": [1]}, headers=patient)
    assert answer.status == 200


def test_a_models_default_priority_is_its_requests_level(app: Client) -> None:
    assert app.request("POST", "/v1/models/tuned:predict", json={"instances": [5]}).status == 200
    assert app.request("POST", "/v1/models/plain:predict", json={"instances": [5]}).status == 200
    scrape = app.request("GET", "/metrics").text
    assert 'twinserve_priority_requests_total{model="tuned",outcome="ok",priority="2"}' in scrape
    assert 'twinserve_priority_requests_total{model="plain",outcome="ok",priority="1"}' in scrape


def test_settings_file_wins_over_class_and_class_over_flags(model_file: Path) -> None:
    config = load_config(models=[f"{model_file}:Tuned"], arch="async", max_batch_size=2, max_queue=100)
    runtime = ModelRuntime(f"{model_file}:Tuned", config, {"max_batch_size": 16})
    try:
        assert runtime.max_batch_size == 16  # the settings file's
        assert runtime.config.max_queue == 8  # the class's
        assert runtime.config.max_batch_delay_ms == config.max_batch_delay_ms  # the server's
        assert config.max_batch_size == 2  # the server's own Config is untouched
    finally:
        runtime.close()


def test_a_server_wide_key_is_refused_by_name(model_file: Path) -> None:
    with pytest.raises(ConfigError, match="'port' is a server-wide setting"):
        ModelRuntime(f"{model_file}:ServerWide", load_config(models=[f"{model_file}:ServerWide"]))
    with pytest.raises(ConfigError, match="'no_such' is not a setting"):
        model_config(Config(), {"no_such": 1}, "m")


def test_cross_field_rules_hold_per_model(model_file: Path) -> None:
    # --arch hybrid runs predict in model-worker processes: a model cannot ask for threads there.
    with pytest.raises(ConfigError, match=r"model 'threaded'.*hybrid runs predict in model-worker processes"):
        ModelRuntime(f"{model_file}:Threaded", load_config(models=[f"{model_file}:Threaded"], arch="hybrid"))
    with pytest.raises(ConfigError, match="default-priority 5 is past --priority-levels 3"):
        model_config(Config(), {"default_priority": 5}, "m")
    with pytest.raises(ConfigError, match="settings key 'max_batch_size'"):
        model_config(Config(), {"max_batch_size": 0}, "m")


def test_a_bad_settings_attribute_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad_settings.py"
    path.write_text("class Odd:\n    settings = 3\n    def predict(self, batch):\n        return batch\n")
    with pytest.raises(ConfigError, match=r"Odd\.settings must be a dict"):
        ModelRuntime(f"{path}:Odd", Config())


@pytest.mark.parametrize("arch", ["hybrid"])
def test_model_workers_per_model_in_hybrid(tmp_path: Path, arch: str) -> None:
    path = tmp_path / "two_workers.py"
    path.write_text(
        "class Pair:\n    settings = {'model_workers': 2}\n    def predict(self, batch):\n        return batch\n"
    )
    with served(arch, [f"{path}:Pair"]) as client:
        serving = client.request("GET", "/v1/models/pair").json()["serving"]
        assert serving["settings"]["model_workers"] == 2 and len(serving["worker_pids"]) == 2
        config = client.request("GET", "/v2/models/pair/config").json()
        assert config["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
