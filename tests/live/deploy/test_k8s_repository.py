"""`twinserve k8s --model-repository DIR`: the pod serves the repository at /models, from the image or from an
existing PersistentVolumeClaim; the manifests pass the Kubernetes schemas and the command parses back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.live.deploy.kube import check_crd, check_native
from tests.live.deploy.test_k8s import bench
from twinserve.cli import build_parser, main
from twinserve.config import load_config
from twinserve.deploy.commands import k8s_config
from twinserve.deploy.dockerfile import REPOSITORY_CONTEXT, dockerfile
from twinserve.deploy.k8s import (
    ADMIN_KEY_ENTRY,
    READY_PATH,
    REPOSITORY_PATH,
    REPOSITORY_VOLUME,
    inference_service,
    manifests,
    serve_command,
    to_yaml,
)
from twinserve.deploy.k8s_plan import K8sPlan
from twinserve.deploy.wheel import wheel_name

ARCHS = ("sync", "async", "hybrid")
MODEL = "class Plain:\n    def predict(self, batch):\n        return batch\n"


def make_repository(root: Path) -> Path:
    """Two models: `plain` in versions 1 and 2, `flat` with no version folder."""
    for folder in (root / "plain" / "1", root / "plain" / "2", root / "flat"):
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(MODEL)
    (root / "plain" / "twinserve.toml").write_text('model = "model.py:Plain"\n')
    (root / "flat" / "twinserve.toml").write_text('model = "model.py:Plain"\n')
    (root / "plain" / "1" / "__pycache__").mkdir()
    return root


def plan_for(arch: str, repository: Path, volume: str | None = None, **settings: Any) -> K8sPlan:
    config = k8s_config({"arch": arch, "model_repository": repository, **settings})
    return K8sPlan(config=config, image="registry.example/models:1", name="models", repository_volume=volume)


def docs_of(plan: K8sPlan) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all(to_yaml([*manifests(plan), inference_service(plan)], "header"))
    return {d["kind"]: d for d in docs}


def pods(docs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The Deployment's pod spec and the InferenceService's predictor: both run the container."""
    return [docs["Deployment"]["spec"]["template"]["spec"], docs["InferenceService"]["spec"]["predictor"]]


@pytest.mark.parametrize("volume", [None, "model-store"], ids=["image", "volume"])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_pod_serves_the_repository_at_models(arch: str, volume: str | None, tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    plan = plan_for(arch, repository, volume, model_control="poll", repository_poll_s=30)
    docs = docs_of(plan)
    for doc in docs.values():
        if doc["kind"] == "InferenceService":
            check_crd(doc)
        elif doc["kind"] in ("Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"):
            check_native(doc)
    for pod in pods(docs):
        (container,) = pod["containers"]
        command = container["command"]
        assert command[:2] == ["twinserve", "serve"] and str(repository) not in command
        # The local folder becomes the container's path; every other flag (model control) passes through: with
        # the local path put back, the command parses into the very Config the manifests were made from.
        assert command[command.index("--model-repository") + 1] == REPOSITORY_PATH
        local = [str(repository) if arg == REPOSITORY_PATH else arg for arg in command]
        args = build_parser().parse_args(local[1:])
        assert args.models == []  # no MODEL argument beside the repository
        overrides = {k: v for k, v in vars(args).items() if k not in ("command", "models")}
        assert load_config(**overrides) == plan.config
        assert plan.config.model_control == "poll" and plan.config.repository_poll_s == 30
        assert container["readinessProbe"]["httpGet"]["path"] == READY_PATH  # the models that loaded
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        if volume is None:  # the image holds it: nothing mounted over it
            assert REPOSITORY_PATH not in mounts and REPOSITORY_VOLUME not in volumes
        else:
            assert mounts[REPOSITORY_PATH] == {
                "name": REPOSITORY_VOLUME,
                "mountPath": REPOSITORY_PATH,
                "readOnly": True,
            }
            claim = volumes[REPOSITORY_VOLUME]["persistentVolumeClaim"]
            assert claim == {"claimName": volume, "readOnly": True}
    assert docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["path"] == (
        READY_PATH
    )


def copied_to_models(text: str) -> list[str]:
    """The Dockerfile's COPY lines into the repository's path."""
    return [
        line for line in text.splitlines() if line.startswith("COPY ") and json.loads(line[5:])[-1] == REPOSITORY_PATH
    ]


def test_the_dockerfile_copies_the_repository_where_the_command_names_it(tmp_path: Path) -> None:
    config = k8s_config({"arch": "async", "model_repository": make_repository(tmp_path)})
    lines = dockerfile(config, wheel_name(), repository_in_image=True).splitlines()
    assert f"COPY {json.dumps([REPOSITORY_CONTEXT, REPOSITORY_PATH])}" in lines
    command = json.loads(lines[-1][4:])
    assert command == serve_command(config) and command[command.index("--model-repository") + 1] == REPOSITORY_PATH
    assert copied_to_models(dockerfile(config, wheel_name())) == []  # from a volume: the image holds no models


def test_out_puts_the_repository_in_the_build_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repository = make_repository(tmp_path / "repo")
    out = tmp_path / "out"
    assert main(["k8s", "--image", "i", "--model-repository", str(repository), "--out", str(out)]) == 0
    capsys.readouterr()
    copied = out / REPOSITORY_CONTEXT
    assert (copied / "plain" / "2" / "model.py").read_text() == MODEL
    assert (copied / "flat" / "twinserve.toml").is_file() and not (copied / "plain" / "1" / "__pycache__").exists()
    assert f"COPY {json.dumps([REPOSITORY_CONTEXT, REPOSITORY_PATH])}" in (out / "Dockerfile").read_text()
    pod = yaml.safe_load((out / "kubernetes.yaml").read_text().split("---", 2)[1])["spec"]["template"]["spec"]
    assert REPOSITORY_PATH in pod["containers"][0]["command"]

    # From a volume: no copy, and the Dockerfile holds no models.
    volume_out = tmp_path / "volume-out"
    argv = ["--model-repository", str(repository), "--repository-volume", "store", "--out", str(volume_out)]
    assert main(["k8s", "--image", "i", *argv]) == 0
    capsys.readouterr()
    assert not (volume_out / REPOSITORY_CONTEXT).exists()
    assert copied_to_models((volume_out / "Dockerfile").read_text()) == []


def test_repository_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repository = make_repository(tmp_path / "repo")
    assert main(["k8s", "--image", "i", "--repository-volume", "store"]) == 2
    assert "--repository-volume: needs --model-repository" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["k8s", "--image", "i", "--model-repository", str(repository), "--repository-volume", "Not_A_Name"])
    assert "PersistentVolumeClaim" in capsys.readouterr().err
    assert main(["k8s", "--image", "i", "--model-repository", str(repository / "missing")]) == 2
    assert "--model-repository" in capsys.readouterr().err
    # Explicit control reaches the one pod a request lands on: said, not refused (one pod is fine).
    assert main(["k8s", "--image", "i", "--model-repository", str(repository), "--model-control", "explicit"]) == 0
    assert "reaches the one pod" in capsys.readouterr().err
    argv = ["--model-repository", str(repository), "--model-control", "explicit", "--replicas", "1"]
    assert main(["k8s", "--image", "i", *argv]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_admin_key_comes_from_the_secret_never_from_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repository = make_repository(tmp_path / "repo")
    argv = ["--model-repository", str(repository), "--model-control", "explicit", "--replicas", "1"]
    assert main(["k8s", "--image", "i", *argv, "--admin-api-key", "admin-key-123456"]) == 2
    assert "--admin-api-key: keys never go into a manifest" in capsys.readouterr().err
    plan = plan_for("async", repository)
    plan = K8sPlan(config=plan.config, image="i", api_key_secret=("keys", "api-keys"))
    (container,) = docs_of(plan)["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert env["TWINSERVE_ADMIN_API_KEY"] == {"name": "keys", "key": ADMIN_KEY_ENTRY, "optional": True}
    check_native(docs_of(plan)["Deployment"])
    config = k8s_config({"model_repository": repository, "api_keys": ["k" * 16], "admin_api_key": "a" * 16})
    assert "a" * 16 not in serve_command(config) and "--admin-api-key" not in serve_command(config)


def test_results_of_a_repository_bench_deploy_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repository = make_repository(tmp_path / "repo")
    measured = bench().model_copy(update={"model": str(repository), "repository": str(repository)})
    data = tmp_path / "results.json"
    data.write_text(measured.model_dump_json())
    assert main(["k8s", "--image", "i", "--results", str(data), "--slo-p95-ms", "50", "--arch", "async"]) == 0
    deployment = next(yaml.safe_load_all(capsys.readouterr().out))
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[2:4] == ["--arch", "async"] and command[command.index("--model-repository") + 1] == REPOSITORY_PATH
