"""A Grafana dashboard for one twinserve deployment, on the metrics every architecture exposes (S26).

Throughput and responses by status, latency percentiles, queue depth and wait, batch size, refusals by reason,
memory per process, worker deaths, and the error-budget burn rates of `deploy.monitoring`'s recording rules. The
variables: `datasource` (a Prometheus), `job` (the deployment's scrape job; `twinserve k8s` sets it to the
deployment's name) and `model` (one, several or all). Every query is a plain PromQL string in `targets[].expr`,
which the tests run against a real Prometheus scraping a real server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinserve.deploy.monitoring import LATENCY_BUDGET, LATENCY_ENDPOINTS, Scope, recorded
from twinserve.service.routes import INFERENCE_ENDPOINTS

__all__ = ["SCHEMA_VERSION", "dashboard", "expressions"]

Doc = dict[str, Any]

#: Grafana's dashboard JSON model version this file is written for (Grafana 10 and later read it).
SCHEMA_VERSION = 39
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_WIDTH, _HEIGHT = 12, 8  # half of Grafana's 24-column grid per panel

_OWN = 'job="$job"'
_MODEL = 'model=~"$model"'
_INFER = f'endpoint=~"{"|".join(sorted(INFERENCE_ENDPOINTS))}"'
_TIMED = f'endpoint=~"{"|".join(LATENCY_ENDPOINTS)}"'
_RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class _Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class _Panel:
    title: str
    unit: str
    targets: tuple[_Target, ...]
    description: str = ""


def _quantiles(metric: str, matchers: str, by: str = "") -> tuple[_Target, ...]:
    group = f"le{', ' + by if by else ''}"
    legend = f"{{{{{by}}}}} " if by else ""
    return tuple(
        _Target(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{matchers}}}{_RATE})))",
            f"{legend}p{round(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    )


def _panels(scope: Scope) -> list[_Panel]:
    requests = f"twinserve_requests_total{{{_OWN},{_MODEL},{_INFER}}}"
    panels = [
        _Panel(
            "Throughput",
            "reqps",
            (_Target(f"sum by (model) (rate({requests}{_RATE}))", "{{model}}"),),
            "Inference requests answered per second, every status.",
        ),
        _Panel(
            "Responses by status",
            "reqps",
            (_Target(f"sum by (code) (rate({requests}{_RATE}))", "{{code}}"),),
            "503: refused (queue full, shutting down) or a model worker died; 504: a deadline passed; 429: rate limit.",
        ),
        _Panel(
            "Latency",
            "s",
            _quantiles("twinserve_request_duration_seconds", f"{_OWN},{_MODEL},{_TIMED}"),
            "Received to response ready, predict and infer requests (the server's view: add the network).",
        ),
        _Panel(
            "Queue depth",
            "short",
            (
                _Target(f"sum by (model) (twinserve_queued_instances{{{_OWN},{_MODEL}}})", "{{model}} queued"),
                _Target(f"sum (twinserve_in_flight_requests{{{_OWN}}})", "in flight"),
            ),
            f"Instances waiting for a model worker (each pod refuses past {scope.queue_capacity}), and requests "
            "being handled.",
        ),
        _Panel(
            "Queue wait",
            "s",
            _quantiles("twinserve_queue_wait_seconds", f"{_OWN},{_MODEL}"),
            "Time an instance waited to be batched (0 for sync's direct calls).",
        ),
        _Panel(
            "Batch size",
            "short",
            (
                _Target(
                    f"sum by (model) (rate(twinserve_batch_size_sum{{{_OWN},{_MODEL}}}{_RATE})) / "
                    f"sum by (model) (rate(twinserve_batch_size_count{{{_OWN},{_MODEL}}}{_RATE}))",
                    "{{model}} mean",
                ),
                _Target(
                    f"histogram_quantile(0.95, sum by (le, model) "
                    f"(rate(twinserve_batch_size_bucket{{{_OWN},{_MODEL}}}{_RATE})))",
                    "{{model}} p95",
                ),
            ),
            "Instances per predict call.",
        ),
        _Panel(
            "Refusals by reason",
            "reqps",
            (
                _Target(
                    f"sum by (model, reason) (rate(twinserve_rejected_requests_total{{{_OWN},{_MODEL}}}{_RATE}))",
                    "{{model}} {{reason}}",
                ),
            ),
            "Requests refused by admission control; empty until the first refusal.",
        ),
        _Panel(
            "Memory per process",
            "bytes",
            (
                _Target(f"twinserve_process_resident_memory_bytes{{{_OWN}}}", "{{instance}} {{role}} pid {{pid}}"),
                _Target(f"sum by (instance) (twinserve_resident_memory_bytes{{{_OWN}}})", "{{instance}} total"),
            ),
            "Resident memory of each server and model-worker process, and of each pod's whole server.",
        ),
        _Panel(
            "Worker deaths",
            "short",
            (_Target(f"sum by (instance) (increase(twinserve_worker_deaths_total{{{_OWN}}}{_RATE}))", "{{instance}}"),),
            "Server and model-worker processes that died (killed, crashed, OOM-killed) and were replaced.",
        ),
    ]
    burn = [
        _Target(f"{recorded('errors', w)}{{{_OWN}}} / {1 - scope.objectives.availability / 100:g}", f"availability {w}")
        for w in ("5m", "1h", "6h")
    ]
    if scope.objectives.p95_ms is not None:
        burn += [
            _Target(f"{recorded('slow', w)}{{{_OWN}}} / {LATENCY_BUDGET:g}", f"latency {w}") for w in ("5m", "1h", "6h")
        ]
    panels.append(
        _Panel(
            "Error budget burn rate",
            "short",
            tuple(burn),
            "How many times faster than the SLO allows the error budget burns (1: exactly spent over 30 days); "
            "the alerts page at 14.4 over 1 h and 6 over 6 h. Needs the recording rules `twinserve k8s` emits.",
        )
    )
    return panels


def _panel(index: int, panel: _Panel) -> Doc:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": _DATASOURCE,
        "gridPos": {"x": (index % 2) * _WIDTH, "y": (index // 2) * _HEIGHT, "w": _WIDTH, "h": _HEIGHT},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": _DATASOURCE, "expr": t.expr, "legendFormat": t.legend}
            for i, t in enumerate(panel.targets)
        ],
    }


def _variables(scope: Scope) -> list[Doc]:
    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
        {
            "name": "job",
            "label": "Deployment",
            "type": "query",
            "datasource": _DATASOURCE,
            "query": {"query": "label_values(twinserve_requests_total, job)", "refId": "job"},
            "current": {"text": scope.job, "value": scope.job},
            "refresh": 2,
        },
        {
            "name": "model",
            "label": "Model",
            "type": "query",
            "datasource": _DATASOURCE,
            "query": {
                "query": 'label_values(twinserve_requests_total{job="$job", model!=""}, model)',
                "refId": "model",
            },
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "refresh": 2,
        },
    ]


def dashboard(scope: Scope) -> Doc:
    """The dashboard's JSON model (import it in Grafana, or ship it in a ConfigMap for Grafana's sidecar)."""
    return {
        "uid": f"twinserve-{scope.job}"[:40],
        "title": f"twinserve · {scope.job}",
        "tags": ["twinserve"],
        "schemaVersion": SCHEMA_VERSION,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": _variables(scope)},
        "panels": [_panel(i, p) for i, p in enumerate(_panels(scope))],
    }


def expressions(board: Doc) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of `board`: what the tests run against a real Prometheus."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]
