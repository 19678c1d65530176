"""Prometheus alerting rules for one twinserve deployment: SLO burn rate, queue saturation, worker deaths, refusals.

Emitted as a plain rules file and as a `PrometheusRule`, both built from one `Scope` and its `Objectives`. The SLO
alerts are the Google SRE workbook's multiwindow, multi-burn-rate alerts: one fires when the error budget burns
`factor` times too fast over a long window and a short one (so it ends soon after the burn stops). Two SLIs:
inference answered with a 5xx (refusals and deadlines included: the caller got no answer), and, with a P95
objective, requests slower than it, read at the largest histogram bound not above it (early, never late).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinserve.observability.metrics import LATENCY_BUCKETS
from twinserve.service.routes import INFERENCE_ENDPOINTS

__all__ = [
    "BURN_WINDOWS",
    "DEFAULT_AVAILABILITY",
    "LATENCY_BUDGET",
    "LATENCY_ENDPOINTS",
    "QUEUE_SATURATION",
    "REJECTION_RATIO",
    "BurnWindow",
    "Objectives",
    "Scope",
    "latency_bucket_s",
    "prometheus_rule",
    "recorded",
    "rule_groups",
    "rules_file",
    "selector",
]

Doc = dict[str, Any]

#: 99.9% of inference requests answered without a server error: about 43 minutes of errors a month.
DEFAULT_AVAILABILITY = 99.9
#: Requests whose latency the P95 objective is about; streams and WebSockets last as long as their client wants.
LATENCY_ENDPOINTS = ("infer", "predict")
#: A P95 objective lets 5% of requests be slower.
LATENCY_BUDGET = 0.05
#: A queue this full for `QUEUE_FOR` is about to refuse requests with 503.
QUEUE_SATURATION = 0.8
QUEUE_FOR = "5m"
#: More than this share of a model's requests refused by admission control for `REJECTION_FOR` is worth a look.
REJECTION_RATIO = 0.05
REJECTION_FOR = "10m"
#: A death in this window keeps the alert firing long enough to be seen.
DEATH_WINDOW = "15m"
#: What series of this deployment are summed by: one SLO per deployment, whatever pod answered.
_BY = "namespace, job"


@dataclass(frozen=True)
class BurnWindow:
    """Alert when the budget burns `factor` times too fast over both `long` and `short` (SRE workbook, table 5-8)."""

    long: str
    short: str
    factor: float
    severity: str


#: 2% of a 30-day budget in an hour, 5% in six hours (both page), 10% in three days (a ticket).
BURN_WINDOWS = (
    BurnWindow("1h", "5m", 14.4, "critical"),
    BurnWindow("6h", "30m", 6.0, "critical"),
    BurnWindow("3d", "6h", 1.0, "warning"),
)


@dataclass(frozen=True)
class Objectives:
    """The SLO: `availability` percent of inference requests without a 5xx; `p95_ms`: 95% of them faster."""

    availability: float = DEFAULT_AVAILABILITY
    p95_ms: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.availability < 100:
            raise ValueError(f"the availability objective must be a percentage below 100, not {self.availability}")
        if self.p95_ms is not None:
            latency_bucket_s(self.p95_ms)  # refuses an objective below every bucket


@dataclass(frozen=True)
class Scope:
    """Which series are this deployment's (its Prometheus `job`, and namespace), and what its pods hold."""

    job: str
    namespace: str | None = None
    #: Instances one pod may queue per model: --max-queue for each of its worker processes.
    queue_capacity: int = 1024
    objectives: Objectives = field(default_factory=Objectives)


def latency_bucket_s(p95_ms: float) -> float:
    """The largest latency bucket bound (seconds) not above the objective: where the histogram can count."""
    below = [b for b in LATENCY_BUCKETS if b <= p95_ms / 1000 + 1e-12]
    if not below:
        raise ValueError(f"a P95 objective of {p95_ms:g} ms is below the smallest latency bucket")
    return below[-1]


def _le(bound: float) -> str:
    return repr(float(bound))  # how prometheus-client writes a bucket bound (`0.25`, `1.0`)


def selector(scope: Scope, *matchers: str) -> str:
    """`{job="...",namespace="...",...}` selecting this deployment's series, plus `matchers`."""
    own = [f'job="{scope.job}"'] + ([f'namespace="{scope.namespace}"'] if scope.namespace else [])
    return "{" + ",".join([*own, *matchers]) + "}"


def _endpoints(names: tuple[str, ...] | frozenset[str]) -> str:
    return f'endpoint=~"{"|".join(sorted(names))}"'


def recorded(sli: str, window: str) -> str:
    """The name of the recording rule holding SLI `sli`'s bad-request ratio over `window`."""
    return f"twinserve:request_{sli}:ratio_rate{window}"


def _windows() -> list[str]:
    seen: dict[str, None] = {}
    for w in BURN_WINDOWS:
        seen.update({w.long: None, w.short: None})
    return list(seen)


def _ratio_rules(scope: Scope) -> list[Doc]:
    inference = _endpoints(INFERENCE_ENDPOINTS)
    rules: list[Doc] = []
    for window in _windows():
        everything = selector(scope, 'model!=""', inference)
        errors = selector(scope, 'model!=""', inference, 'code=~"5.."')
        total = f"sum by ({_BY}) (rate(twinserve_requests_total{everything}[{window}]))"
        # `or ... * 0`: no 5xx at all is a ratio of 0, not an empty result.
        bad = f"(sum by ({_BY}) (rate(twinserve_requests_total{errors}[{window}])) or {total} * 0)"
        rules.append({"record": recorded("errors", window), "expr": f"{bad} / {total}"})
    p95 = scope.objectives.p95_ms
    if p95 is not None:
        latency = _endpoints(LATENCY_ENDPOINTS)
        bucket = selector(scope, 'model!=""', latency, f'le="{_le(latency_bucket_s(p95))}"')
        count = selector(scope, 'model!=""', latency)
        for window in _windows():
            fast = f"sum by ({_BY}) (rate(twinserve_request_duration_seconds_bucket{bucket}[{window}]))"
            total = f"sum by ({_BY}) (rate(twinserve_request_duration_seconds_count{count}[{window}]))"
            rules.append({"record": recorded("slow", window), "expr": f"1 - {fast} / {total}"})
    return rules


def _burn_alerts(scope: Scope, sli: str, name: str, budget: float, what: str) -> list[Doc]:
    own = selector(scope)
    alerts: list[Doc] = []
    for severity in ("critical", "warning"):
        windows = [w for w in BURN_WINDOWS if w.severity == severity]
        conditions = [
            f"({recorded(sli, w.long)}{own} > {w.factor:g} * {budget:g}"
            f" and {recorded(sli, w.short)}{own} > {w.factor:g} * {budget:g})"
            for w in windows
        ]
        pace = "fast" if severity == "critical" else "slow"
        spans = " or ".join(f"{w.long}/{w.short} at {w.factor:g}x" for w in windows)
        alerts.append(
            {
                "alert": f"Twinserve{name}BudgetBurn{pace.capitalize()}",
                "expr": " or ".join(conditions),
                "labels": {"severity": severity, "slo": sli},
                "annotations": {
                    "summary": f"{scope.job}: the {what} error budget burns too {pace} ({spans})",
                    "description": f"{{{{ $value | humanizePercentage }}}} of requests {_bad(sli, scope)} over the "
                    f"long window; the budget is {budget:.4g} of them.",
                },
            }
        )
    return alerts


def _bad(sli: str, scope: Scope) -> str:
    if sli == "errors":
        return "answered with a 5xx"
    p95 = scope.objectives.p95_ms
    assert p95 is not None
    return f"slower than {latency_bucket_s(p95) * 1000:g} ms (P95 objective {p95:g} ms)"


def _service_alerts(scope: Scope) -> list[Doc]:
    queued = f"sum by ({_BY}, instance, model) (twinserve_queued_instances{selector(scope)})"
    limit = QUEUE_SATURATION * scope.queue_capacity
    refused = f"sum by ({_BY}, model, reason) (rate(twinserve_rejected_requests_total{selector(scope)}[5m]))"
    models = selector(scope, 'model!=""')
    answered = f"sum by ({_BY}, model) (rate(twinserve_requests_total{models}[5m]))"
    return [
        {
            "alert": "TwinserveQueueSaturated",
            "expr": f"{queued} > {limit:g}",
            "for": QUEUE_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"{scope.job}: {{{{ $labels.instance }}}} queues over {QUEUE_SATURATION:.0%} of its "
                f"capacity for {{{{ $labels.model }}}}",
                "description": f"{{{{ $value }}}} instances wait (capacity {scope.queue_capacity} per pod): "
                "requests past it get 503 queue_full. Add replicas or lower the load.",
            },
        },
        {
            "alert": "TwinserveWorkerDied",
            "expr": f"increase(twinserve_worker_deaths_total{selector(scope)}[{DEATH_WINDOW}]) > 0",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"{scope.job}: a worker process of {{{{ $labels.instance }}}} died",
                "description": f"{{{{ $value }}}} server or model-worker processes died in {DEATH_WINDOW} (killed, "
                "crashed or OOM-killed); each was replaced. Look at the pod's logs and memory.",
            },
        },
        {
            "alert": "TwinserveRejectionRateHigh",
            "expr": f"{refused} / on ({_BY}, model) group_left {answered} > {REJECTION_RATIO:g}",
            "for": REJECTION_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"{scope.job}: over {REJECTION_RATIO:.0%} of {{{{ $labels.model }}}}'s requests "
                "refused ({{ $labels.reason }})",
                "description": "{{ $value | humanizePercentage }} of the requests are refused by admission "
                "control for this reason.",
            },
        },
    ]


def rule_groups(scope: Scope) -> list[Doc]:
    """The recording and alerting rule groups, as both a rules file and a PrometheusRule hold them."""
    objectives = scope.objectives
    budget = 1 - objectives.availability / 100
    alerts = _burn_alerts(scope, "errors", "Availability", budget, f"availability ({objectives.availability:g}%)")
    if objectives.p95_ms is not None:
        alerts += _burn_alerts(scope, "slow", "Latency", LATENCY_BUDGET, f"latency (P95 {objectives.p95_ms:g} ms)")
    # One group: Prometheus evaluates a group's rules in order, so each burn-rate alert reads the ratios recorded in
    # the same evaluation; across two groups the order is not fixed and an alert could read the previous one's.
    return [{"name": f"twinserve-{scope.job}", "rules": _ratio_rules(scope) + alerts + _service_alerts(scope)}]


def rules_file(scope: Scope) -> Doc:
    """A Prometheus rules file (`promtool check rules` checks it)."""
    return {"groups": rule_groups(scope)}


def prometheus_rule(scope: Scope, metadata: Doc) -> Doc:
    """The same groups as a Prometheus Operator `PrometheusRule`."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": metadata,
            "spec": {"groups": rule_groups(scope)}}  # fmt: skip
