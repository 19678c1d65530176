"""The alerting rules and the Grafana dashboard `twinserve k8s` emits, checked by the tools that will read them.

- `promtool check rules` on the plain rules file and on the PrometheusRule's groups, and `promtool test rules`
  unit tests of what fires when (SLO burn rate, queue saturation, worker deaths, refusals);
- every query of the dashboard, run against a real Prometheus scraping a real server of each architecture, with
  the rules loaded: each must be valid PromQL and, after traffic, return data.

promtool ships with Debian's `prometheus` (scripts/system-deps.sh installs it). Without it these tests skip on a
developer's machine, and fail in CI (CI=true), where it must be there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ARCHS
from tests.live.deploy.kube import check_crd
from tests.serving import Server, model_path, predict
from twinserve.cli import main
from twinserve.deploy.commands import k8s_config
from twinserve.deploy.dashboard import dashboard, expressions
from twinserve.deploy.k8s import manifests, monitoring_scope, pod_monitor
from twinserve.deploy.k8s_plan import K8sPlan
from twinserve.deploy.monitoring import Objectives, Scope, rules_file
from twinserve.lab.servers import PrometheusServer

IMAGE = "registry.example/twinserve:0.1.0"
JOB = "iris"


@pytest.fixture(scope="module")
def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("promtool is missing in CI: scripts/system-deps.sh installs it (Debian's prometheus)")
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    return binary


def promtool_run(promtool: str, *args: str, cwd: Path) -> None:
    done = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def k8s(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`twinserve k8s --image IMAGE ARGS...` (in this process); its stdout."""
    capsys.readouterr()
    code = main(["k8s", "--image", IMAGE, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


# -- promtool check rules --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags",
    [[], ["--slo-p95-ms", "250", "--slo-availability", "99.5"], ["--arch", "hybrid", "--namespace", "ml"]],
    ids=["defaults", "latency-slo", "hybrid-namespace"],
)
def test_emitted_rules_pass_promtool_check(
    promtool: str, tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "rules.yaml"
    plain.write_text(k8s(capsys, "--alert-rules", *flags))
    promtool_run(promtool, "check", "rules", str(plain), cwd=tmp_path)

    docs = list(yaml.safe_load_all(k8s(capsys, *flags)))
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    check_crd(rule)
    assert rule["spec"] == yaml.safe_load(plain.read_text())  # the same groups, both ways
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    expected = {"TwinserveAvailabilityBudgetBurnFast", "TwinserveAvailabilityBudgetBurnSlow"}
    expected |= {"TwinserveQueueSaturated", "TwinserveWorkerDied", "TwinserveRejectionRateHigh"}
    if "--slo-p95-ms" in flags:
        expected |= {"TwinserveLatencyBudgetBurnFast", "TwinserveLatencyBudgetBurnSlow"}
    assert alerts == expected


def test_the_pod_monitor_names_the_job_the_rules_select() -> None:
    plan = K8sPlan(config=k8s_config({"arch": "async", "workers": 3, "max_queue": 50}), image=IMAGE, name=JOB)
    monitor = pod_monitor(plan)
    label = monitor["spec"]["jobLabel"]
    assert plan_labels(plan)[label] == JOB
    scope = monitoring_scope(plan)
    assert scope.job == JOB and scope.queue_capacity == 150  # each of the 3 workers queues up to 50
    assert [d["kind"] for d in manifests(plan)][-2:] == ["PodMonitor", "PrometheusRule"]


def plan_labels(plan: K8sPlan) -> dict[str, str]:
    labels: dict[str, str] = manifests(plan)[0]["spec"]["template"]["metadata"]["labels"]
    return labels


def test_objectives_out_of_range_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="percentage"):
        Objectives(availability=100)
    with pytest.raises(ValueError, match="below the smallest"):
        Objectives(p95_ms=0.1)
    with pytest.raises(SystemExit) as exited:
        main(["k8s", "--image", IMAGE, "--slo-availability", "100"])
    assert exited.value.code == 2 and "--slo-availability" in capsys.readouterr().err
    assert main(["k8s", "--image", IMAGE, "--slo-p95-ms", "0.1"]) == 2
    assert "below the smallest latency bucket" in capsys.readouterr().err


def test_an_objective_between_buckets_is_counted_at_the_bucket_below(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["k8s", "--image", IMAGE, "--slo-p95-ms", "200", "--alert-rules"]) == 0
    out, err = capsys.readouterr()
    assert "over 100 ms" in err
    assert 'le="0.1"' in out and 'le="0.25"' not in out


# -- promtool test rules -----------------------------------------------------------------------------------------
def _without_annotations(scope: Scope) -> dict[str, Any]:
    """The rules with their annotations dropped: promtool compares annotations verbatim, and their templates are
    checked by `promtool check rules` above; these tests are about when each alert fires."""
    rules = rules_file(scope)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return rules


def _requests(code: str, values: str, endpoint: str = "predict") -> dict[str, str]:
    labels = f'job="{JOB}",model="iris",endpoint="{endpoint}",code="{code}"'
    return {"series": f"twinserve_requests_total{{{labels}}}", "values": values}


def _latency(le: str, values: str) -> dict[str, str]:
    name = "twinserve_request_duration_seconds_bucket" if le else "twinserve_request_duration_seconds_count"
    labels = f'job="{JOB}",model="iris",endpoint="predict"' + (f',le="{le}"' if le else "")
    return {"series": f"{name}{{{labels}}}", "values": values}


def _queued(values: str) -> dict[str, str]:
    return {"series": f'twinserve_queued_instances{{job="{JOB}",instance="pod-a:8000",model="iris"}}', "values": values}


def _case(interval: str, series: list[dict[str, str]], alerts: list[tuple[str, str, list[dict[str, str]]]]) -> Any:
    return {
        "interval": interval,
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in fired]}
            for at, name, fired in alerts
        ],
    }


FAST_ERRORS = {"job": JOB, "severity": "critical", "slo": "errors"}
SLOW_ERRORS = {"job": JOB, "severity": "warning", "slo": "errors"}
FAST_LATENCY = {"job": JOB, "severity": "critical", "slo": "slow"}
QUEUE = {"job": JOB, "instance": "pod-a:8000", "model": "iris", "severity": "warning"}


def test_burn_rate_and_queue_alerts_fire_when_they_should(promtool: str, tmp_path: Path) -> None:
    scope = Scope(job=JOB, queue_capacity=100, objectives=Objectives(availability=99.9, p95_ms=250))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_without_annotations(scope)))
    tests = [
        # 9% of requests fail for an hour: 60x the budget rate, over both windows: page.
        _case("1m", [_requests("200", "0+600x120"), _requests("503", "0+60x120")],
              [("1h", "TwinserveAvailabilityBudgetBurnFast", [FAST_ERRORS])]),
        # 0.05% fail: half the budget rate: no page.
        _case("1m", [_requests("200", "0+2000x120"), _requests("503", "0+1x120")],
              [("1h", "TwinserveAvailabilityBudgetBurnFast", [])]),
        # 4xx answers are the client's, not the budget's.
        _case("1m", [_requests("200", "0+600x120"), _requests("429", "0+600x120")],
              [("1h", "TwinserveAvailabilityBudgetBurnFast", [])]),
        # 80% of requests slower than 250 ms for an hour: page; 10% slower: within a P95 of 250 ms... nearly.
        _case("1m", [_latency("0.25", "0+100x120"), _latency("", "0+500x120")],
              [("1h", "TwinserveLatencyBudgetBurnFast", [FAST_LATENCY])]),
        _case("1m", [_latency("0.25", "0+450x120"), _latency("", "0+500x120")],
              [("1h", "TwinserveLatencyBudgetBurnFast", [])]),
        # The queue holds 90 of 100 for 10 minutes: saturated; at 70, or at 90 for only 3 minutes, not.
        _case("1m", [_queued("90x20")], [("10m", "TwinserveQueueSaturated", [QUEUE])]),
        _case("1m", [_queued("70x20")], [("10m", "TwinserveQueueSaturated", [])]),
        _case("1m", [_queued("90x3 10x20")], [("10m", "TwinserveQueueSaturated", [])]),
    ]  # fmt: skip
    # Three days of samples every 30 minutes (evaluated as often: every minute would take promtool half a minute).
    slow = [
        # Evaluated at 4 days, a day past the longest window: the recording rules and the alert are in different
        # groups, whose order within one 30 min evaluation promtool does not fix, so the edge of the 3-day window
        # is no place to judge.
        # 0.05% fail for four days: half the budget rate: not even a ticket.
        _case("30m", [_requests("200", "0+60000x200"), _requests("503", "0+30x200")],
              [("4d", "TwinserveAvailabilityBudgetBurnSlow", [])]),
        # 0.2% fail for four days: twice the budget rate: a ticket.
        _case("30m", [_requests("200", "0+30000x200"), _requests("503", "0+60x200")],
              [("4d", "TwinserveAvailabilityBudgetBurnSlow", [SLOW_ERRORS])]),
    ]  # fmt: skip
    for name, interval, cases in (("fast.yaml", "1m", tests), ("slow.yaml", "30m", slow)):
        (tmp_path / name).write_text(
            yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": interval, "tests": cases})
        )
        promtool_run(promtool, "test", "rules", name, cwd=tmp_path)


def test_worker_death_and_refusal_alerts_fire_when_they_should(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_without_annotations(Scope(job=JOB))))
    deaths = {"series": f'twinserve_worker_deaths_total{{job="{JOB}",instance="pod-a:8000"}}'}
    refused = {"series": f'twinserve_rejected_requests_total{{job="{JOB}",model="iris",reason="queue_full"}}'}
    died = {"job": JOB, "instance": "pod-a:8000", "severity": "warning"}
    refusing = {"job": JOB, "model": "iris", "reason": "queue_full", "severity": "warning"}
    tests = [
        _case("1m", [{**deaths, "values": "0x5 1x30"}],
              [("3m", "TwinserveWorkerDied", []), ("8m", "TwinserveWorkerDied", [died]),
               ("30m", "TwinserveWorkerDied", [])]),
        # 10% of the requests (answered with 503) refused for 20 minutes: alert; 1%: not.
        _case("1m", [_requests("200", "0+900x30"), _requests("503", "0+100x30"), {**refused, "values": "0+100x30"}],
              [("20m", "TwinserveRejectionRateHigh", [refusing])]),
        _case("1m", [_requests("200", "0+990x30"), _requests("503", "0+10x30"), {**refused, "values": "0+10x30"}],
              [("20m", "TwinserveRejectionRateHigh", [])]),
    ]  # fmt: skip
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    promtool_run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)


# -- the dashboard against a real Prometheus -----------------------------------------------------------------
#: Grafana's variables as a user with this deployment and model selected would have them; `$__rate_interval`
#: is Grafana's, at least four scrape intervals (1 s here).
def _substitute(expr: str, job: str, model: str) -> str:
    values = {"$__rate_interval": "10s", "$job": job, "$model": model}
    return re.sub(r"\$__rate_interval|\$job|\$model", lambda m: values[m.group(0)], expr)


def test_the_dashboard_is_grafana_json_with_its_variables(capsys: pytest.CaptureFixture[str]) -> None:
    board = json.loads(k8s(capsys, "--dashboard", "--name", JOB))
    assert board["uid"] == f"twinserve-{JOB}" and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "job", "model"} and variables["job"]["current"]["value"] == JOB
    titles = [p["title"] for p in board["panels"]]
    for wanted in ("Throughput", "Latency", "Queue depth", "Batch size", "Refusals by reason", "Memory per process"):
        assert wanted in titles
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    for _, expr in expressions(board):
        assert set(re.findall(r"\$\w+", expr)) <= {"$job", "$model", "$__rate_interval"}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_dashboard_query_answers_against_a_real_prometheus(arch: str, tmp_path: Path) -> None:
    scope = Scope(job="twinserve", queue_capacity=64, objectives=Objectives(p95_ms=250))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_file(scope)))
    board = dashboard(scope)
    with (
        Server([model_path("Echo")], arch, "--max-body-bytes", "2048") as server,
        PrometheusServer([f"127.0.0.1:{server.port}"], tmp_path / "prometheus", rule_files=[rules]) as prom,
    ):
        # A model's series appear with its first request: scraped once before the rest, so that rates over the
        # traffic see an increase (a series whose first sample already holds every request has a rate of 0).
        everything = 'sum(twinserve_requests_total{job="twinserve",model="echo",endpoint="predict"})'
        assert predict(server, "echo", [0]).status_code == 200
        _wait_for(prom, everything, lambda v: v == 1)
        sent = 12
        for i in range(1, sent):
            assert predict(server, "echo", [i]).status_code == 200
        too_big = predict(server, "echo", ["x" * 4096])
        assert too_big.status_code == 413  # refused by admission: the refusals panel has a series
        _wait_for(prom, everything, lambda v: v == sent + 1)
        # The refusal's series begins with the 413: a rate needs two of its samples in the window.
        refused = 'count_over_time(twinserve_rejected_requests_total{job="twinserve"}[10s])'
        _wait_for(prom, refused, lambda v: v >= 2)
        _wait_for(prom, 'twinserve:request_slow:ratio_rate5m{job="twinserve"}', lambda v: v == v)  # not NaN
        for title, expr in expressions(board):
            query = _substitute(expr, "twinserve", "echo")
            result = prom.query(query)["result"]
            assert result, f"{title}: {query} returned no data after traffic"
        # The ratios agree with what was sent: no 5xx (the 413 is the client's); a share of slow requests.
        assert _value(prom, 'twinserve:request_errors:ratio_rate5m{job="twinserve"}') == 0
        assert 0 <= (_value(prom, 'twinserve:request_slow:ratio_rate5m{job="twinserve"}') or 0) <= 1


def _value(prom: PrometheusServer, expr: str) -> float | None:
    result = prom.query(expr)["result"]
    return float(result[0]["value"][1]) if result else None


def _wait_for(prom: PrometheusServer, expr: str, condition: Any, timeout: float = 60.0) -> None:
    """Until `expr`'s first value meets `condition` (Prometheus scrapes and evaluates every second)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = _value(prom, expr)
        except httpx.TransportError:
            seen = None
        if seen is not None and condition(seen):
            return
        time.sleep(0.2)  # polling interval while Prometheus scrapes and evaluates
    raise AssertionError(f"{expr} never met the condition; last value {seen}")
