"""Kubernetes manifests for one twinserve server: Deployment, Service, autoscaler, PodMonitor, alerts, KServe.

Every object is a plain dict built from one `K8sPlan` (deploy/k8s_plan.py), whose `Config` is the one `twinserve
serve` would build from the same flags; the container runs exactly `serve_command(config)`. Sync autoscales on CPU
utilization, async and hybrid on `twinserve_in_flight_requests` per pod (via prometheus-adapter). A model
repository is at `REPOSITORY_PATH`, in the image or on a read-only PersistentVolumeClaim. The PodMonitor names the
scrape job after the deployment, which the alerting rules and the Grafana dashboard select on.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from twinserve.cli_args import flag_args
from twinserve.config import Config
from twinserve.deploy.k8s_plan import K8sPlan, cpu_request_cores, sizing
from twinserve.deploy.monitoring import Scope, prometheus_rule
from twinserve.secret_settings import secret_fields, url_has_credential

__all__ = [
    "ADMIN_KEY_ENTRY",
    "DEFAULT_CPU_UTILIZATION",
    "DEFAULT_IN_FLIGHT_PER_CORE",
    "HTTP_PORT_NAME",
    "IN_FLIGHT_METRIC",
    "LIVE_PATH",
    "METRICS_PATH",
    "PRESTOP_SLEEP_S",
    "READY_PATH",
    "REDIS_URL_ENTRY",
    "REPOSITORY_PATH",
    "REPOSITORY_VOLUME",
    "RUN_AS_USER",
    "STARTUP_PERIOD_S",
    "TMP_DIR",
    "adapter_rules",
    "autoscaler",
    "deployment",
    "hpa_metric",
    "inference_service",
    "manifests",
    "monitoring_scope",
    "pod_monitor",
    "rules",
    "serve_command",
    "service",
    "termination_grace_s",
    "to_yaml",
]

Doc = dict[str, Any]

HTTP_PORT_NAME = "http"
GRPC_PORT_NAME = "grpc"
LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"
METRICS_PATH = "/metrics"
IN_FLIGHT_METRIC = "twinserve_in_flight_requests"
DEFAULT_CPU_UTILIZATION = 70
DEFAULT_IN_FLIGHT_PER_CORE = 8.0
PRESTOP_SLEEP_S = 5  # endpoints controllers and kube-proxy stop routing to the pod before SIGTERM reaches it
STARTUP_PERIOD_S = 5
RUN_AS_USER = 10001
TMP_DIR = "/tmp"
#: Where the container finds a model repository, whichever way it got there (image or volume).
REPOSITORY_PATH = "/models"
#: The pod volume holding the repository when it comes from a PersistentVolumeClaim.
REPOSITORY_VOLUME = "model-repository"
#: The entry of the --api-key-secret Secret holding the repository API's admin key (`--admin-api-key`).
ADMIN_KEY_ENTRY = "admin-api-key"
#: The entry of the --api-key-secret Secret holding a Redis URL that carries a password (`--redis-url`).
REDIS_URL_ENTRY = "redis-url"
#: Fields the manifest always sets on the command line, whatever their value.
_ALWAYS = ("arch", "host", "port", "workers")


def serve_command(config: Config) -> list[str]:
    """`twinserve serve MODEL... --arch A --host H --port P --workers N` plus every setting off its default.

    A model repository is named by its path in the container (`REPOSITORY_PATH`), not the local one."""
    # With a repository `models` holds Config's default, which the repository stands in for: no MODEL argument.
    command = ["twinserve", "serve", *(config.models if config.model_repository is None else [])]
    secrets = secret_fields(config)
    for name, field in Config.model_fields.items():
        if name == "models":
            continue
        value = getattr(config, name)
        if name not in _ALWAYS and value == field.get_default(call_default_factory=True):
            continue
        if name in secrets:
            continue  # secrets never go into a manifest: each from the --api-key-secret Secret (`_env`)
        if name == "workers":
            value = config.effective_workers
        if name == "model_repository":
            value = REPOSITORY_PATH
        command += flag_args(name, value)
    return command


def _quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers plain, fractions in milli-units."""
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def _labels(plan: K8sPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "twinserve", "app.kubernetes.io/instance": plan.name}


def _metadata(plan: K8sPlan, name: str | None = None, **extra: Any) -> Doc:
    meta: Doc = {"name": name or plan.name}
    if plan.namespace:
        meta["namespace"] = plan.namespace
    meta["labels"] = {**_labels(plan), "app.kubernetes.io/component": plan.config.arch}
    meta.update(extra)
    return meta


def _probe(path: str, period: int, failures: int, port: bool = True) -> Doc:
    action: Doc = {"path": path, "port": HTTP_PORT_NAME} if port else {"path": path}
    return {"httpGet": action, "periodSeconds": period, "timeoutSeconds": 2, "failureThreshold": failures}


def _container(plan: K8sPlan, port_name: str, probes: dict[str, Doc]) -> Doc:
    size = sizing(plan)
    memory = f"{size.memory_mib}Mi"
    return {
        "name": "twinserve" if port_name == HTTP_PORT_NAME else "kserve-container",
        "image": plan.image,
        "command": serve_command(plan.config),
        # Knative (KServe) takes one port per container: there gRPC stays off the manifest (see inference_service).
        "ports": [
            {"name": port_name, "containerPort": plan.config.port, "protocol": "TCP"},
            *(_grpc_ports(plan) if port_name == HTTP_PORT_NAME else []),
        ],
        # TMPDIR, not a fixed PROMETHEUS_MULTIPROC_DIR: the server makes a fresh metrics directory under it on
        # each start, while a fixed one on the emptyDir would keep a crashed container's stale files.
        "env": _env(plan),
        "resources": {
            "requests": {"cpu": _quantity(size.cpu_cores), "memory": memory},
            "limits": {"memory": memory},
        },
        **probes,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": TMP_DIR}, *_repository_mounts(plan)],
    }


def _repository_mounts(plan: K8sPlan) -> list[Doc]:
    """The repository's volume at REPOSITORY_PATH, read-only: the server only reads it (poll included)."""
    if plan.repository_volume is None:
        return []
    return [{"name": REPOSITORY_VOLUME, "mountPath": REPOSITORY_PATH, "readOnly": True}]


def _env(plan: K8sPlan) -> list[Doc]:
    env: list[Doc] = [{"name": "TMPDIR", "value": TMP_DIR}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if plan.api_key_secret is not None:
        # Keys never appear in a manifest: the server reads them from a Secret the cluster owner creates.
        name, key = plan.api_key_secret
        env.append({"name": "TWINSERVE_API_KEYS", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
        if plan.config.model_repository is not None:
            # The repository API's admin key, from the same Secret when it has one (optional: none, no changes).
            admin = {"name": name, "key": ADMIN_KEY_ENTRY, "optional": True}
            env.append({"name": "TWINSERVE_ADMIN_API_KEY", "valueFrom": {"secretKeyRef": admin}})
    if url_has_credential(plan.config.redis_url):
        # A Redis URL with a password: from the same Secret (`_repository_checks` made sure there is one).
        assert plan.api_key_secret is not None
        redis = {"name": plan.api_key_secret[0], "key": REDIS_URL_ENTRY}
        env.append({"name": "TWINSERVE_REDIS_URL", "valueFrom": {"secretKeyRef": redis}})
    return env


def _volumes(plan: K8sPlan) -> list[Doc]:
    volumes: list[Doc] = [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]
    if plan.repository_volume is not None:
        claim = {"claimName": plan.repository_volume, "readOnly": True}
        volumes.append({"name": REPOSITORY_VOLUME, "persistentVolumeClaim": claim})
    return volumes


def _pod_security() -> Doc:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _scrape_annotations(plan: K8sPlan) -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(plan.config.port),
        "prometheus.io/path": METRICS_PATH,
    }


def termination_grace_s(config: Config) -> int:
    """Longer than the preStop sleep plus the server's own graceful timeout, so SIGKILL never cuts it short."""
    return PRESTOP_SLEEP_S + math.ceil(config.graceful_timeout) + 5


def deployment(plan: K8sPlan) -> Doc:
    startup_failures = max(1, math.ceil(plan.startup_timeout_s / STARTUP_PERIOD_S))
    container = _container(
        plan,
        HTTP_PORT_NAME,
        {
            # The server answers at once, live while its models load and ready once they have: the startup probe
            # on readiness gives the load --startup-timeout; liveness and readiness start once it has passed, and
            # liveness then restarts only a server that stopped answering, never one still loading.
            "startupProbe": _probe(READY_PATH, STARTUP_PERIOD_S, startup_failures),
            "livenessProbe": _probe(LIVE_PATH, 10, 3),
            "readinessProbe": _probe(READY_PATH, 5, 2),
        },
    )
    container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}}
    spec: Doc = {
        "selector": {"matchLabels": _labels(plan)},
        "template": {
            "metadata": {
                "labels": {**_labels(plan), "app.kubernetes.io/component": plan.config.arch},
                "annotations": _scrape_annotations(plan),
            },
            "spec": {
                "terminationGracePeriodSeconds": termination_grace_s(plan.config),
                "securityContext": _pod_security(),
                "containers": [container],
                "volumes": _volumes(plan),
            },
        },
    }
    if plan.replicas is not None:  # left unset under an autoscaler, so re-applying never fights it
        spec = {"replicas": plan.replicas, **spec}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _metadata(plan), "spec": spec}


def _grpc_ports(plan: K8sPlan) -> list[Doc]:
    """The container's gRPC port (`--grpc-port`), when it serves one."""
    port = plan.config.grpc_port
    if port is None:
        return []
    return [{"name": GRPC_PORT_NAME, "containerPort": port, "protocol": "TCP"}]


def service(plan: K8sPlan) -> Doc:
    port = {"name": HTTP_PORT_NAME, "port": plan.config.port, "targetPort": HTTP_PORT_NAME, "protocol": "TCP"}
    ports = [port]
    if plan.config.grpc_port is not None:
        # appProtocol tells meshes and gateways that this port speaks HTTP/2 gRPC (one connection, many calls:
        # a plain L4 Service balances connections, not calls; a mesh or a headless Service balances calls).
        grpc_port = plan.config.grpc_port
        ports.append(
            {"name": GRPC_PORT_NAME, "port": grpc_port, "targetPort": GRPC_PORT_NAME, "protocol": "TCP",
             "appProtocol": "grpc"}
        )  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(plan),
        "spec": {"type": "ClusterIP", "selector": _labels(plan), "ports": ports},
    }


def hpa_metric(plan: K8sPlan) -> Doc:
    """The autoscaler's metric: CPU utilization for sync, requests in flight per pod for async and hybrid."""
    targets = plan.targets
    if plan.config.arch == "sync":
        utilization = targets.cpu_utilization_percent if targets is not None else None
        target: Doc = {"type": "Utilization", "averageUtilization": utilization or DEFAULT_CPU_UTILIZATION}
        return {"type": "Resource", "resource": {"name": "cpu", "target": target}}
    in_flight = targets.in_flight_per_pod if targets is not None else None
    if in_flight is None:
        in_flight = DEFAULT_IN_FLIGHT_PER_CORE * cpu_request_cores(plan.config)
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": IN_FLIGHT_METRIC},
            "target": {"type": "AverageValue", "averageValue": _quantity(in_flight)},
        },
    }


def autoscaler(plan: K8sPlan) -> Doc:
    low, high = plan.autoscale
    basis = plan.targets.describe() if plan.targets is not None else "twinserve's defaults (no bench results)"
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(plan, annotations={"twinserve.dev/target-basis": basis}),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": plan.name},
            "minReplicas": low,
            "maxReplicas": high,
            "metrics": [hpa_metric(plan)],
        },
    }


def adapter_rules(plan: K8sPlan) -> Doc:
    """prometheus-adapter's rule exposing the in-flight gauge as a Pods metric: merge into the adapter's config."""
    rule = {
        "seriesQuery": f'{IN_FLIGHT_METRIC}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{IN_FLIGHT_METRIC}$", "as": IN_FLIGHT_METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }
    note = "rules for prometheus-adapter: merge into its config.yaml (Helm chart: rules.custom)"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(plan, f"{plan.name}-prometheus-adapter-rules", annotations={"twinserve.dev/note": note}),
        "data": {"rules.yaml": yaml.safe_dump({"rules": [rule]}, sort_keys=False)},
    }


def pod_monitor(plan: K8sPlan) -> Doc:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(plan),
        "spec": {
            # The job label takes the pods' instance label (the plan's name), which the rules and dashboard select.
            "jobLabel": "app.kubernetes.io/instance",
            "selector": {"matchLabels": _labels(plan)},
            "podMetricsEndpoints": [{"port": HTTP_PORT_NAME, "path": METRICS_PATH, "interval": "15s"}],
        },
    }


def monitoring_scope(plan: K8sPlan) -> Scope:
    """What the alerting rules and the dashboard watch: the PodMonitor's job, and what one pod may queue."""
    capacity = plan.config.max_queue * plan.config.effective_workers  # each worker process has its own queue
    return Scope(job=plan.name, namespace=plan.namespace, queue_capacity=capacity, objectives=plan.objectives)


def rules(plan: K8sPlan) -> Doc:
    """The alerting rules as a PrometheusRule (the Prometheus Operator loads it; `deploy.monitoring`)."""
    return prometheus_rule(monitoring_scope(plan), _metadata(plan))


def manifests(plan: K8sPlan) -> list[Doc]:
    """Deployment, Service, then (autoscaled) HorizontalPodAutoscaler and adapter rules, then PodMonitor and
    PrometheusRule."""
    docs = [deployment(plan), service(plan)]
    if plan.replicas is None:
        docs.append(autoscaler(plan))
        if plan.config.arch != "sync":
            docs.append(adapter_rules(plan))
    docs += [pod_monitor(plan), rules(plan)]
    return docs


def inference_service(plan: K8sPlan) -> Doc:
    """A KServe InferenceService running the same command (twinserve speaks V1 `:predict` and V2 itself).

    Knative owns the one port a container may declare (named `http1`, probes without a port; `--grpc-port`
    is not exposed there: KServe serves gRPC from a second InferenceService whose port is named `h2c`), start-up
    and draining, so the container has
    no startupProbe, preStop or grace period; it scales on concurrency (async, hybrid) or CPU (sync). Its liveness
    probe passes while the models load (the server answers live from the start), so a slow load is not restarted.
    """
    container = _container(
        plan,
        "http1",
        {"livenessProbe": _probe(LIVE_PATH, 10, 3, port=False), "readinessProbe": _probe(READY_PATH, 5, 2, port=False)},
    )
    low, high = (plan.replicas, plan.replicas) if plan.replicas is not None else plan.autoscale
    metric = hpa_metric(plan)
    if plan.config.arch == "sync":
        scale: Doc = {"scaleMetric": "cpu", "scaleTarget": metric["resource"]["target"]["averageUtilization"]}
    else:
        in_flight = plan.targets.in_flight_per_pod if plan.targets is not None else None
        target = in_flight if in_flight is not None else DEFAULT_IN_FLIGHT_PER_CORE * cpu_request_cores(plan.config)
        scale = {"scaleMetric": "concurrency", "scaleTarget": max(1, math.floor(target))}
    annotations = {"serving.kserve.io/enable-prometheus-scraping": "true", **_scrape_annotations(plan)}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": _metadata(plan, annotations=annotations),
        "spec": {
            "predictor": {
                "minReplicas": low,
                "maxReplicas": high,
                **scale,
                "securityContext": _pod_security(),
                "containers": [container],
                "volumes": _volumes(plan),
            }
        },
    }


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with multi-line strings (the adapter's rules) as readable `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _represent_str)


def to_yaml(docs: list[Doc], header: str = "") -> str:
    """Multi-document YAML, optionally under a `#` comment header."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True)
