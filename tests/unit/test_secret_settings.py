"""Secrets never written by the commands that write settings out (twinserve/secret_settings.py): `tune`'s settings
file and serve line (results.json and the report carry the line), `k8s`'s manifests and Dockerfile (issue #44: a
Redis password given as --redis-url was in every manifest's header and args, the Dockerfile's CMD, winner.toml,
results.json, report.html and the printed serve line; the settings writer left out api_keys, not admin_api_key)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from twinserve.cli import main
from twinserve.config import load_config
from twinserve.deploy.commands import k8s_config
from twinserve.deploy.dockerfile import dockerfile
from twinserve.deploy.k8s import REDIS_URL_ENTRY, manifests, serve_command, to_yaml
from twinserve.deploy.k8s_plan import K8sPlan
from twinserve.lab import settings_writer
from twinserve.secret_settings import secret_fields, url_has_credential

PASSWORD = "s3cret-redis-pass"
MODEL = "twinserve.examples.io:FeatureLookup"
SECRET_URLS = [
    f"redis://:{PASSWORD}@cache:6379/0",
    f"redis://user:{PASSWORD}@cache:6379/0",
    f"redis://cache:6379/0?password={PASSWORD}",
    f"rediss://cache:6380/0?ssl_keyfile=/k&password={PASSWORD}",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_url_with_a_credential_is_a_secret(url: str) -> None:
    assert url_has_credential(url)
    assert "redis_url" in secret_fields(load_config(models=[MODEL], redis_url=url))


@pytest.mark.parametrize("url", ["redis://cache:6379/0", "redis://127.0.0.1:6379", "unix:///run/redis.sock"])
def test_an_address_is_not(url: str) -> None:
    assert not url_has_credential(url)
    config = load_config(models=[MODEL], redis_url=url)
    assert "redis_url" not in secret_fields(config)
    assert f"redis_url = {settings_writer.toml_value(url)}" in settings_writer.settings_file_text(config)


@pytest.mark.parametrize("url", SECRET_URLS)
def test_tune_writes_no_secret(url: str) -> None:
    config = load_config(
        models=[MODEL], redis_url=url, api_keys=["k" * 20], admin_api_key="a" * 20, model_repository=None
    )
    text = settings_writer.settings_file_text(config, "written by tune")
    line = shlex.join(settings_writer.serve_command(config))
    for written in (text, line):
        assert PASSWORD not in written and "k" * 20 not in written and "a" * 20 not in written
    # The file says what it left out, and where it comes from instead.
    assert "# redis_url holds a secret: not written here; set TWINSERVE_REDIS_URL where it runs" in text
    assert "# admin_api_key holds a secret" in text and "# api_keys holds a secret" in text


@pytest.mark.parametrize("url", SECRET_URLS)
def test_k8s_takes_the_url_from_the_secret(url: str) -> None:
    config = k8s_config({"models": [MODEL], "redis_url": url})
    assert "--redis-url" not in serve_command(config)
    plan = K8sPlan(config=config, image="i", api_key_secret=("keys", "api-keys"))
    documents = manifests(plan)
    assert PASSWORD not in to_yaml(documents) and PASSWORD not in dockerfile(config, "twinserve-0-py3-none-any.whl")
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["TWINSERVE_REDIS_URL"] == {"secretKeyRef": {"name": "keys", "key": REDIS_URL_ENTRY}}


def test_k8s_without_a_secret_to_take_it_from_refuses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["k8s", MODEL, "--image", "i", "--redis-url", SECRET_URLS[0], "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--redis-url holds a credential" in err and PASSWORD not in err
    assert not (tmp_path / "out").exists()
