"""`twinserve k8s`: manifests that the Kubernetes API types accept and that agree with the server they run."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.factory import level, results, run
from tests.live.deploy.kube import SchemaError, check_crd, check_native, strict
from tests.serving import HTTP, ROOT, ServerProcess, free_port
from twinserve import __version__
from twinserve.cli import build_parser, main
from twinserve.config import Config, load_config
from twinserve.deploy.commands import k8s_config
from twinserve.deploy.context import discover
from twinserve.deploy.dockerfile import WHEEL_DIR, dockerfile, pip_requirement
from twinserve.deploy.k8s import (
    DEFAULT_CPU_UTILIZATION,
    IN_FLIGHT_METRIC,
    _env,
    inference_service,
    manifests,
    serve_command,
    to_yaml,
)
from twinserve.deploy.k8s_plan import K8sPlan, cpu_request_cores, sizing
from twinserve.deploy.wheel import wheel_name
from twinserve.errors import ConfigError
from twinserve.lab.advise import HEADROOM, autoscaling_targets
from twinserve.lab.results import Results
from twinserve.service.routes import ROUTES

ARCHS = ("sync", "async", "hybrid")
SLO = 50.0
CUSTOM = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("serving.kserve.io/v1beta1", "InferenceService"),
}


def bench() -> Results:
    """Each arch meets the SLO up to a known level; the faster level past it breaks the SLO or errs."""
    return results(
        run("sync", "sync", [level(1, 500, 5, cpu=90), level(8, 900, 20, cpu=150), level(32, 950, 80)]),
        run("async", "async", [level(8, 2500, 8), level(32, 3000, 30), level(64, 3100, 40, errors=3)]),
        run("hybrid", "hybrid", [level(8, 1500, 10), level(16, 2000, 45), level(64, 2600, 120)], model_workers=2),
    )


def plan_for(arch: str, with_results: bool = False, **settings: Any) -> K8sPlan:
    config = k8s_config({"arch": arch, **settings})
    targets = autoscaling_targets(bench(), arch, SLO, cpu_request_cores(config)) if with_results else None
    return K8sPlan(
        config=config, image="registry.example/twinserve:0.1.0", name="iris", namespace="ml", targets=targets
    )


def docs_of(plan: K8sPlan) -> list[dict[str, Any]]:
    """Through YAML and back, as `kubectl apply` would read them."""
    return list(yaml.safe_load_all(to_yaml([*manifests(plan), inference_service(plan)], "header")))


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def route_paths() -> set[str]:
    return {route.path for route in ROUTES}


@pytest.mark.parametrize("with_results", [False, True], ids=["defaults", "results"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_object_passes_the_kubernetes_schemas(arch: str, with_results: bool) -> None:
    docs = docs_of(plan_for(arch, with_results, model_workers=2 if arch == "hybrid" else None))
    kinds = [d["kind"] for d in docs]
    expected = ["Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor", "PrometheusRule", "InferenceService"]
    if arch != "sync":
        expected.insert(3, "ConfigMap")  # prometheus-adapter's rule for the in-flight metric
    assert kinds == expected
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            check_crd(doc)
        else:
            check_native(doc)


def test_the_validator_fails_on_a_misspelled_field_a_wrong_type_and_a_missing_field() -> None:
    deployment = by_kind(docs_of(plan_for("async")))["Deployment"]
    check_native(deployment)
    misspelled = copy.deepcopy(deployment)
    misspelled["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/", "port": 1}}
    with pytest.raises(SchemaError, match="readinesProbe: unknown field"):
        check_native(misspelled)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    with pytest.raises(SchemaError, match="containerPort"):
        check_native(wrong_type)
    missing = copy.deepcopy(deployment)
    del missing["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(SchemaError):
        check_native(missing)
    isvc = by_kind(docs_of(plan_for("async")))["InferenceService"]
    isvc["spec"]["predictor"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(SchemaError, match="imagePullPolicyy"):
        check_crd(isvc)
    with pytest.raises(SchemaError):
        strict("V1PodSecurityContext", {"runAsNonRoot": "yes"})


@pytest.mark.parametrize("arch", ARCHS)
def test_ports_probes_and_shutdown_agree_with_the_server(arch: str) -> None:
    plan = plan_for(arch, port=9000, graceful_timeout=45)
    docs = by_kind(docs_of(plan))
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 9000}
    (service_port,) = docs["Service"]["spec"]["ports"]
    assert ports[service_port["targetPort"]] == 9000
    probes = {name: container[name]["httpGet"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {ports[p["port"]] for p in probes.values()} == {9000}
    assert {p["path"] for p in probes.values()} <= route_paths()
    assert probes["livenessProbe"]["path"] == "/v2/health/live"
    assert probes["readinessProbe"]["path"] == probes["startupProbe"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + 45
    assert docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["path"] in route_paths()
    assert docs["PodMonitor"]["spec"]["selector"]["matchLabels"] == docs["Service"]["spec"]["selector"]
    assert docs["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod_labels(docs).items()
    isvc = docs["InferenceService"]["spec"]["predictor"]["containers"][0]
    assert isvc["ports"][0]["containerPort"] == 9000 and isvc["command"] == container["command"]
    assert {isvc[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")} <= route_paths()


def test_the_grpc_port_is_exposed() -> None:
    docs = by_kind(docs_of(plan_for("async", port=9000, grpc_port=9001)))
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 9000, "grpc": 9001}
    assert container["command"][container["command"].index("--grpc-port") + 1] == "9001"
    grpc_port = next(p for p in docs["Service"]["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["port"] == 9001 and grpc_port["targetPort"] == "grpc" and grpc_port["appProtocol"] == "grpc"
    (isvc,) = docs["InferenceService"]["spec"]["predictor"]["containers"]
    assert [p["name"] for p in isvc["ports"]] == ["http1"]  # Knative takes one port per container
    with pytest.raises(ConfigError, match="--grpc-port"):
        k8s_config({"arch": "async", "grpc_port": 0})


def pod_labels(docs: dict[str, dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_pod_runs_non_root_on_a_read_only_root_with_a_writable_tmp() -> None:
    docs = by_kind(docs_of(plan_for("hybrid")))
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] > 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mounts[env["TMPDIR"]])


@pytest.mark.parametrize(
    "settings",
    [
        {"arch": "sync"},
        {"arch": "sync", "workers": "3", "threads": "8", "worker_class": "sync", "graceful_timeout": "12.5"},
        {"arch": "async", "max_batch_size": "16", "max_batch_delay_ms": "2", "access_log": False, "port": "9000"},
        {"arch": "hybrid", "model_workers": "4", "timeout_ms": "250", "cache_size": "100", "tracing": True},
        {"models": ["twinserve.examples.tabular:Classifier", "pkg.mod:Other"], "arch": "async", "rate_limit": "50"},
    ],
)
def test_the_container_command_parses_into_the_same_config(settings: dict[str, Any]) -> None:
    config = k8s_config(settings)
    command = serve_command(config)
    assert command[:2] == ["twinserve", "serve"]
    args = build_parser().parse_args(command[1:])
    overrides = {k: v for k, v in vars(args).items() if k != "command"}
    assert load_config(**overrides) == config
    assert config.host == "0.0.0.0" and config.workers is not None  # never the node's core count


def test_autoscaling_targets_come_from_the_best_level_within_the_slo() -> None:
    data = bench()
    sync = autoscaling_targets(data, "sync", SLO, cpu_request_cores=1.0)
    assert sync.basis.level.concurrency == 8 and sync.cpu_utilization_percent == round(HEADROOM * 150)
    assert sync.in_flight_per_pod is None
    asyn = autoscaling_targets(data, "async", SLO)
    assert asyn.basis.level.concurrency == 32  # 64 was faster but had errors
    assert asyn.in_flight_per_pod == pytest.approx(HEADROOM * 32)
    assert autoscaling_targets(data, "hybrid", SLO).in_flight_per_pod == pytest.approx(HEADROOM * 16)
    assert autoscaling_targets(data, "async", 9).basis.level.concurrency == 8  # a tighter SLO, a lower target
    with pytest.raises(ValueError, match="no hybrid level"):
        autoscaling_targets(data, "hybrid", 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_autoscaler_uses_the_advisor_targets_and_the_metric_of_its_arch(arch: str) -> None:
    plan = plan_for(arch, with_results=True)
    targets = autoscaling_targets(bench(), arch, SLO, cpu_request_cores(plan.config))
    docs = by_kind(docs_of(plan))
    hpa = docs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "iris"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 10)
    assert "replicas" not in docs["Deployment"]["spec"]  # the autoscaler owns it
    (metric,) = hpa["metrics"]
    predictor = docs["InferenceService"]["spec"]["predictor"]
    if arch == "sync":
        assert metric["resource"] == {
            "name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": targets.cpu_utilization_percent},
        }
        assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("cpu", targets.cpu_utilization_percent)
    else:
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == IN_FLIGHT_METRIC
        assert metric["pods"]["target"]["type"] == "AverageValue"
        assert quantity(metric["pods"]["target"]["averageValue"]) == pytest.approx(targets.in_flight_per_pod)
        assert predictor["scaleMetric"] == "concurrency"
        rules = yaml.safe_load(docs["ConfigMap"]["data"]["rules.yaml"])["rules"]
        assert rules[0]["name"]["as"] == IN_FLIGHT_METRIC and IN_FLIGHT_METRIC in rules[0]["seriesQuery"]


def quantity(text: str) -> float:
    match = re.fullmatch(r"(\d+)(m?)", text)
    assert match, text
    return int(match[1]) / (1000 if match[2] else 1)


def test_without_results_the_documented_defaults_apply_and_replicas_can_be_fixed() -> None:
    hpa = by_kind(docs_of(plan_for("sync")))["HorizontalPodAutoscaler"]["spec"]
    assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == DEFAULT_CPU_UTILIZATION
    config = k8s_config({"arch": "async"})
    fixed = by_kind(manifests(K8sPlan(config=config, image="i", replicas=3)))
    assert fixed["Deployment"]["spec"]["replicas"] == 3
    assert "HorizontalPodAutoscaler" not in fixed and "ConfigMap" not in fixed


def test_resources_follow_the_processes_and_the_measured_memory() -> None:
    hybrid = k8s_config({"arch": "hybrid", "workers": 2, "model_workers": 3})
    assert cpu_request_cores(hybrid) == 2 * 3 + 0.5 * 2
    size = sizing(K8sPlan(config=hybrid, image="i", memory_per_process_mib=100))
    assert (size.server_processes, size.model_processes) == (3, 6)  # 2 fronts + supervisor, 2 x 3 model workers
    assert size.memory_mib == 64 * -(-(1.25 * 9 * 100) // 64)
    assert cpu_request_cores(k8s_config({"arch": "sync", "workers": 4, "threads": 16})) == 4
    measured = plan_for("async", with_results=True)  # factory levels: 300 MiB over 2 processes
    assert sizing(measured).memory_mib == 64 * -(-(1.25 * 150) // 64)
    container = by_kind(docs_of(measured))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == f"{sizing(measured).memory_mib}Mi"


def test_the_dockerfile_runs_the_same_command_as_a_non_root_user() -> None:
    config = k8s_config({"arch": "async", "port": 9000})
    text = dockerfile(config, wheel_name(), ["otel"])
    lines = text.splitlines()
    assert lines[0] == "FROM python:3.11-slim"
    # twinserve from the wheel in the build context, with the extra: no index has to have this release
    assert f'COPY ["{wheel_name()}", "{WHEEL_DIR}/"]' in lines
    assert f'RUN pip install "{WHEEL_DIR}/twinserve-{__version__}-py3-none-any.whl[otel]"' in text
    assert pip_requirement(wheel_name()) == f"{WHEEL_DIR}/{wheel_name()}"
    assert re.search(r"^USER [1-9]\d*:", text, re.M) and "EXPOSE 9000" in lines
    assert json.loads(next(line for line in lines if line.startswith("CMD "))[4:]) == serve_command(config)


def copies(dockerfile_text: str) -> list[list[str]]:
    """The [source..., destination] of each COPY (JSON form)."""
    return [json.loads(line[5:]) for line in dockerfile_text.splitlines() if line.startswith("COPY ")]


def test_out_is_a_build_context_with_the_wheel_and_the_model_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Everything the Dockerfile COPYs is in --out, at the paths the command names under WORKDIR."""
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "models" / "echo.py").write_text("class Echo:\n    def predict(self, batch: list[str]) -> list[str]:\n")
    (project / "scorers").mkdir()
    (project / "scorers" / "__init__.py").write_text("")
    (project / "scorers" / "__pycache__").mkdir()
    (project / "scorers" / "__pycache__" / "x.pyc").write_bytes(b"")
    monkeypatch.chdir(project)
    out = tmp_path / "out"
    models = ["models/echo.py:Echo", "scorers.fast:Scorer", "twinserve.examples.tabular:Classifier"]
    assert main(["k8s", "--image", "i", "--arch", "async", "--out", str(out), "--extra", "otel", *models]) == 0
    printed = capsys.readouterr().out
    text = (out / "Dockerfile").read_text()
    assert copies(text) == [
        [wheel_name(), f"{WHEEL_DIR}/"],
        ["models/echo.py", "models/"],
        ["scorers", "scorers"],  # an uninstalled package in the working directory; twinserve's own is in the wheel
    ]
    assert "carried models/echo.py (66 B): the module of models/echo.py:Echo" in printed.splitlines()
    assert "skipped scorers/__pycache__/: bytecode" in printed.splitlines()
    assert "extra otel: --extra" in printed.splitlines()
    for source, _ in copies(text):
        assert (out / source).exists()
    assert (out / "models" / "echo.py").read_text() == (project / "models" / "echo.py").read_text()
    assert not (out / "scorers" / "__pycache__").exists()
    assert json.loads(text.splitlines()[-1][4:])[2:5] == models
    assert "WORKDIR /app" in text.splitlines()

    with zipfile.ZipFile(out / wheel_name()) as wheel:
        names = wheel.namelist()
        info = f"twinserve-{__version__}.dist-info"
        assert {"twinserve/__init__.py", "twinserve/py.typed", "twinserve/examples/tabular.py"} <= set(names)
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        metadata = wheel.read(f"{info}/METADATA").decode()
        assert f"Version: {__version__}" in metadata and "Provides-Extra: otel" in metadata
        # from this checkout's pyproject.toml (an editable install's metadata is as old as the install)
        project = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]
        requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if "Requires-Dist" in line]
        assert requires[: len(project["dependencies"])] == project["dependencies"]
        assert 'opentelemetry-sdk>=1.25; extra == "otel"' in requires
        assert "twinserve = twinserve.cli:main" in wheel.read(f"{info}/entry_points.txt").decode()
        assert wheel.read(f"{info}/RECORD").decode().count("sha256=") == len(names) - 1
    first = (out / wheel_name()).read_bytes()
    assert main(["k8s", "--image", "i", "--out", str(out)]) == 0
    assert (out / wheel_name()).read_bytes() == first  # the same bytes: the image's pip layer stays cached


def test_out_refuses_model_files_the_image_cannot_hold_at_the_same_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("class M:\n    def predict(self, batch: list[int]) -> list[int]:\n        return batch\n")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for model in (f"{outside}:M", "../outside.py:M", "missing.py:M"):
        assert main(["k8s", "--image", "i", "--out", str(tmp_path / "out"), model]) == 2
        assert "--out:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written before the check
    assert main(["k8s", "--image", "i", f"{outside}:M"]) == 0  # without --out: the user's own image may hold it
    with pytest.raises(ConfigError, match="relative to the current folder"):
        discover(k8s_config({"models": [f"{outside}:M"]}), tmp_path, tmp_path / "out")


def test_invalid_settings_fail_like_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["k8s", "--image", "i", "--arch", "async", "--max-batch-size", "0"]) == 2
    assert "--max-batch-size" in capsys.readouterr().err
    assert main(["k8s", "--image", "i", "--port", "80"]) == 2
    assert "non-root" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["k8s", "--image", "i", "--replicas", "2", "--autoscale", "1,3"])


def test_cli_writes_yaml_to_stdout_and_files_to_out(tmp_path: Path) -> None:
    data = tmp_path / "results.json"
    data.write_text(bench().model_dump_json())
    common = ["--image", "registry.example/twinserve:0.1.0", "--arch", "async", "--results", str(data)]
    stdout = subprocess.run(
        [sys.executable, "-m", "twinserve", "k8s", *common, "--slo-p95-ms", str(SLO)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert stdout.startswith("# Generated by twinserve")
    docs = list(yaml.safe_load_all(stdout))
    kinds = ["Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "PodMonitor", "PrometheusRule"]
    assert [d["kind"] for d in docs] == kinds
    target = docs[2]["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    assert quantity(target) == pytest.approx(HEADROOM * 32)

    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", "k8s", *common, "--slo-p95-ms", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no async level" in done.stderr  # an unmet SLO fails loudly
    subprocess.run(
        [sys.executable, "-m", "twinserve", "k8s", *common, "--slo-p95-ms", str(SLO), "--out", str(out)],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "Dockerfile", "grafana-dashboard.json", "kserve.yaml", "kubernetes.yaml", "prometheus-rules.yaml", wheel_name()
    ]  # fmt: skip
    assert list(yaml.safe_load_all((out / "kubernetes.yaml").read_text())) == docs
    (isvc,) = yaml.safe_load_all((out / "kserve.yaml").read_text())
    check_crd(isvc)
    assert (
        isvc["spec"]["predictor"]["containers"][0]["command"]
        == docs[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    )
    assert "--arch async" in " ".join(json.loads((out / "Dockerfile").read_text().splitlines()[-1][4:]))


def test_config_fields_cover_the_command() -> None:
    """Every flag in the command is a Config field, so nothing reaches the pod that `serve` would not accept."""
    command = serve_command(k8s_config({"arch": "hybrid", "debug": False, "model_workers": 2}))
    flags = {part[2:].removeprefix("no-").replace("-", "_") for part in command if part.startswith("--")}
    assert flags <= set(Config.model_fields)


def generate(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[list[dict[str, Any]], str]:
    data = tmp_path / "results.json"
    data.write_text(bench().model_dump_json())
    assert main(["k8s", "--image", "i", "--results", str(data), "--slo-p95-ms", str(SLO), *flags]) == 0
    captured = capsys.readouterr()
    return list(yaml.safe_load_all(captured.out)), captured.err


def test_results_bring_the_measured_settings_for_flags_left_unset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs, err = generate(tmp_path, capsys, "--arch", "hybrid")
    command = docs[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[2] == bench().model and command[command.index("--model-workers") + 1] == "2" and not err
    # sync measured with serve's default workers: the bench machine's cores (2), so 2 cores requested here too
    docs, _ = generate(tmp_path, capsys, "--arch", "sync")
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][container["command"].index("--workers") + 1] == "2"
    assert container["resources"]["requests"]["cpu"] == "2"
    assert docs[2]["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == round(HEADROOM * 150 / 2)
    _, err = generate(tmp_path, capsys, "--arch", "hybrid", "--model-workers", "3")
    assert "--model-workers 3 differs from the measured 'hybrid'" in err


@pytest.mark.parametrize("arch", ["sync", "hybrid"])
def test_the_container_command_serves_the_probes_and_the_scaling_metric(arch: str, tmp_path: Path) -> None:
    """The pod's command and env, run here: probes answer, the metric exists, metrics live under TMPDIR."""
    port = free_port()
    plan = plan_for(arch, port=port)
    container = by_kind(docs_of(plan))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]} | {"TMPDIR": str(tmp_path)}
    server = ServerProcess([sys.executable, "-m", *container["command"]], port=port, env=env, cwd=ROOT)
    server.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with server:
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert HTTP.get(server.url + container[probe]["httpGet"]["path"], timeout=10).status_code == 200
        assert IN_FLIGHT_METRIC in HTTP.get(server.url + "/metrics", timeout=10).text
        assert any(path.name.startswith("twinserve-metrics-") for path in tmp_path.iterdir())


def test_api_keys_come_from_a_secret_never_from_the_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["k8s", "--image", "i", "--arch", "async", "--api-key", "leaked-key-0123456789", "--api-key-secret", "keys"]
    assert main(flags) == 0
    text = capsys.readouterr().out
    assert "leaked-key-0123456789" not in text
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        check_native(doc) if doc["kind"] not in ("PodMonitor", "PrometheusRule") else check_crd(doc)
    container = by_kind(docs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    keys = [e for e in container["env"] if e["name"] == "TWINSERVE_API_KEYS"]
    assert keys == [{"name": "TWINSERVE_API_KEYS", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api-keys"}}}]
    # The probes stay open with keys on: they point at the health endpoints, which never ask for a key.
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    plan = plan_for("sync")
    assert all(e["name"] != "TWINSERVE_API_KEYS" for e in _env(plan))
    with pytest.raises(SystemExit):
        main([*flags[:-1], "Not_A_Name"])
