"""Validate manifests against the Kubernetes API types, strictly, with the `kubernetes` client's models.

The client's `from_dict` checks required fields and value types (its models are pydantic) but silently drops
fields it does not know. So each document is loaded into its model class and serialised back: anything dropped
(a misspelled or unknown field) or changed (a value coerced from the wrong type) differs from the input, and fails.
Custom resources (PodMonitor, PrometheusRule, InferenceService) have no model here: their required fields are
checked by hand, and the pod-shaped parts inside them go through the same strict check.
"""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client

__all__ = ["SchemaError", "check_crd", "check_native", "strict"]

NATIVE = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
}
_API = client.ApiClient()


class SchemaError(AssertionError):
    pass


def _first_difference(want: Any, got: Any, path: str = "") -> str | None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in want:
            if key not in got:
                return f"{path}.{key}: unknown field"
            found = _first_difference(want[key], got[key], f"{path}.{key}")
            if found:
                return found
        extra = set(got) - set(want)
        return f"{path}: fields added by the model: {sorted(extra)}" if extra else None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{path}: {len(want)} items became {len(got)}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            found = _first_difference(w, g, f"{path}[{i}]")
            if found:
                return found
        return None
    if type(want) is not type(got) or want != got:
        return f"{path}: {want!r} ({type(want).__name__}) read back as {got!r} ({type(got).__name__})"
    return None


def strict(model: str, data: dict[str, Any]) -> None:
    """Load `data` as the client model named `model` and demand it reads back unchanged."""
    klass = getattr(client, model)
    try:
        loaded = klass.from_dict(data)
    except Exception as exc:
        raise SchemaError(f"{model}: {exc}") from exc
    serialized = _API.sanitize_for_serialization(loaded)  # type: ignore[no-untyped-call]  # the client has no hints
    difference = _first_difference(data, serialized, model)
    if difference:
        raise SchemaError(difference)


def check_native(doc: dict[str, Any]) -> None:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in NATIVE:
        raise SchemaError(f"not a Kubernetes-native kind this validator knows: {key}")
    strict(NATIVE[key], doc)


def _require(doc: dict[str, Any], *path: str) -> Any:
    node: Any = doc
    for i, key in enumerate(path):
        if not isinstance(node, dict) or key not in node:
            raise SchemaError(f"{doc.get('kind')}: missing {'.'.join(path[: i + 1])}")
        node = node[key]
    return node


def check_crd(doc: dict[str, Any]) -> None:
    """The fields the PodMonitor, PrometheusRule and InferenceService CRDs require; their pod parts via `strict`."""
    if not isinstance(_require(doc, "metadata", "name"), str):
        raise SchemaError("metadata.name must be a string")
    strict("V1ObjectMeta", doc["metadata"])
    if (doc.get("apiVersion"), doc.get("kind")) == ("monitoring.coreos.com/v1", "PodMonitor"):
        strict("V1LabelSelector", _require(doc, "spec", "selector"))
        endpoints = _require(doc, "spec", "podMetricsEndpoints")
        known = {"port", "path", "interval", "scheme", "scrapeTimeout", "honorLabels", "relabelings"}
        for endpoint in endpoints:
            if set(endpoint) - known or not isinstance(endpoint.get("port"), str):
                raise SchemaError(f"PodMonitor endpoint {endpoint}: unknown field or no named port")
        if set(doc["spec"]) - {"selector", "podMetricsEndpoints", "jobLabel", "namespaceSelector"}:
            raise SchemaError(f"PodMonitor spec: unknown fields {sorted(doc['spec'])}")
    elif (doc.get("apiVersion"), doc.get("kind")) == ("monitoring.coreos.com/v1", "PrometheusRule"):
        # The operator's schema: groups of {name, interval?, rules}; each rule records or alerts (what the rules
        # mean is promtool's to check, in tests/live/test_monitoring.py).
        for group in _require(doc, "spec", "groups"):
            if set(group) - {"name", "interval", "rules"} or not isinstance(group.get("name"), str):
                raise SchemaError(f"PrometheusRule group {group.get('name')!r}: unknown field or no name")
            for rule in group["rules"]:
                if set(rule) - {"record", "alert", "expr", "for", "labels", "annotations"}:
                    raise SchemaError(f"PrometheusRule rule {rule}: unknown field")
                if ("record" in rule) == ("alert" in rule) or not isinstance(rule.get("expr"), str):
                    raise SchemaError(f"PrometheusRule rule {rule}: needs one of record and alert, and an expr")
    elif (doc.get("apiVersion"), doc.get("kind")) == ("serving.kserve.io/v1beta1", "InferenceService"):
        predictor = _require(doc, "spec", "predictor")
        known = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "securityContext", "containers", "volumes"}
        if set(predictor) - known:
            raise SchemaError(f"InferenceService predictor: unknown fields {sorted(set(predictor) - known)}")
        if predictor.get("scaleMetric") not in (None, "cpu", "memory", "concurrency", "rps"):
            raise SchemaError(f"InferenceService scaleMetric {predictor['scaleMetric']!r}")
        strict("V1PodSecurityContext", predictor["securityContext"])
        for volume in predictor.get("volumes", []):
            strict("V1Volume", volume)
        for container in _require(doc, "spec", "predictor", "containers"):
            # Knative fills in the probes' port (its one container port); the core type requires it.
            filled = copy.deepcopy(container)
            for probe in ("livenessProbe", "readinessProbe"):
                if probe in filled:
                    filled[probe]["httpGet"]["port"] = filled["ports"][0]["containerPort"]
            strict("V1Container", filled)
    else:
        raise SchemaError(f"not a custom resource this validator knows: {doc.get('apiVersion')} {doc.get('kind')}")
