"""Load drivers: twinserve's own generator, wrk, Locust and NVIDIA perf_analyzer, all into the same `Level` fields.

Only twinserve's generator drives open-loop levels: wrk (Debian's, not wrk2), Locust's users and perf_analyzer's
threads are closed loops, and none of them corrects for coordinated omission. perf_analyzer sends V2 tensors to
`/v2/models/{name}/infer`; the others send the V1 bodies to `:predict`.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

import orjson

from twinserve.errors import ConfigError
from twinserve.extras import require
from twinserve.lab import perf_analyzer
from twinserve.lab.loadgen import LoadSpec, run_level_sync
from twinserve.lab.plan import BenchPlan

__all__ = ["DriverError", "check_driver", "drive", "instances_per_request", "locustfile_source"]

_NO_WRK = "--driver wrk needs wrk on PATH (Debian: apt-get install wrk)"
_NO_PERF_ANALYZER = (
    "--driver perf_analyzer needs NVIDIA perf_analyzer: python -m twinserve.lab.perf_analyzer install "
    "(or scripts/perf-analyzer.sh install)"
)


class DriverError(RuntimeError):
    """The load driver could not run (missing tool, unsupported mode)."""


def check_driver(driver: str, protocol: str = "v1") -> None:
    """Fail before any server starts when `driver` cannot run here, or cannot speak `protocol`: ConfigError
    (MissingExtra for an extra)."""
    if protocol == "grpc" and driver != "perf_analyzer":
        raise ConfigError("--protocol grpc is driven by perf_analyzer only: add --driver perf_analyzer")
    if driver == "locust":
        require("locust", "--driver locust", "locust")
    elif driver == "wrk" and shutil.which("wrk") is None:
        raise ConfigError(_NO_WRK)
    elif driver == "perf_analyzer" and perf_analyzer.locate() is None:
        raise ConfigError(_NO_PERF_ANALYZER)


def _instances(body: dict[str, Any]) -> int:
    """A V1 body's instances, or a V2 request's rows (its first input's batch dimension)."""
    inputs = body.get("inputs")
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict) and inputs[0].get("shape"):
        return int(inputs[0]["shape"][0])
    return len(body.get("instances", [None]))


def instances_per_request(bodies: list[bytes]) -> float:
    counts = [_instances(orjson.loads(b)) for b in bodies]
    return sum(counts) / len(counts) if counts else 1.0


def v2_requests(base: str, model: str, bodies: list[bytes], payload: object) -> tuple[str, list[bytes]]:
    """`--protocol v2`: the model's V2 infer URL and bodies: the payload's lines (V2 inference requests), else the
    server's own V2 example of the model's examples() (the V1 bodies built from them only its code can convert)."""
    url = f"{base}/v2/models/{model}/infer"
    if payload is not None:
        return url, bodies
    try:
        return url, [orjson.dumps(perf_analyzer.v2_example(base, model))]
    except perf_analyzer.PerfAnalyzerError as exc:
        raise DriverError(str(exc)) from None


def drive(
    plan: BenchPlan,
    url: str,
    bodies: list[bytes],
    mode: Literal["closed", "open"],
    load: float,
    grpc_target: str | None = None,
) -> dict[str, Any]:
    """Run one level with the plan's driver (over gRPC to `grpc_target` with `--protocol grpc`); returns `Level`
    fields."""
    if plan.protocol == "grpc" and plan.driver != "perf_analyzer":
        raise DriverError("--protocol grpc is driven by perf_analyzer only: add --driver perf_analyzer")
    return {**_drive(plan, url, bodies, mode, load, grpc_target), "protocol": plan.protocol}


def _drive(
    plan: BenchPlan,
    url: str,
    bodies: list[bytes],
    mode: Literal["closed", "open"],
    load: float,
    grpc_target: str | None,
) -> dict[str, Any]:
    if plan.driver == "twinserve":
        spec = LoadSpec(
            url=url,
            bodies=bodies,
            duration_s=plan.duration_s,
            warmup_s=plan.warmup_s,
            concurrency=int(load) if mode == "closed" else None,
            rate=load if mode == "open" else None,
            arrivals=plan.arrivals,
        )
        return {"driver": "twinserve", **run_level_sync(spec).to_dict()}
    if mode != "closed":
        raise DriverError(f"--driver {plan.driver} drives closed-loop levels only; use --concurrency")
    if plan.driver == "wrk":
        return _wrk(url, bodies, int(load), plan.duration_s, plan.warmup_s)
    if plan.driver == "perf_analyzer":
        return _perf_analyzer(plan, url, bodies, int(load), grpc_target)
    return _locust(url, bodies, int(load), plan.duration_s, plan.warmup_s)


# -- wrk -----------------------------------------------------------------------------------------------------
_WRK_LUA = """
local bodies = %s
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, bodies[i])
end
done = function(summary, latency, requests)
  local p = {}
  for _, q in ipairs({50, 90, 95, 99, 99.9}) do p[#p + 1] = string.format("%%.1f", latency:percentile(q)) end
  io.write(string.format(
    "TWINSERVE %%d %%d %%d %%d %%d %%d %%d %%s %%.1f %%.1f\\n",
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, table.concat(p, ","), latency.max, latency.mean))
end
"""


def _lua_string(body: bytes) -> str:
    return "[==[" + body.decode() + "]==]"


def _wrk(url: str, bodies: list[bytes], connections: int, duration: float, warmup: float) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise DriverError(_NO_WRK)
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(_WRK_LUA % ("{" + ", ".join(_lua_string(b) for b in bodies) + "}"))
        script.flush()
        threads = max(1, min(2, connections))

        def run(seconds: float) -> str:
            done = subprocess.run(
                [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", script.name, url],
                capture_output=True,
                text=True,
                timeout=seconds + 60,
                check=False,
            )
            if done.returncode != 0:
                raise DriverError(f"wrk failed: {done.stderr.strip() or done.stdout.strip()}")
            return done.stdout

        if warmup > 0:
            run(warmup)
        line = next((x for x in run(duration).splitlines() if x.startswith("TWINSERVE ")), None)
    if line is None:
        raise DriverError("wrk printed no summary")
    fields = line.split()
    requests, micros, connect, read, write, status, timeout = (int(x) for x in fields[1:8])
    p50, p90, p95, p99, p999 = (float(x) / 1000 for x in fields[8].split(","))
    transport = {"connect_refused": connect, "reset": read + write, "timeout": timeout, "other": 0}
    seconds = micros / 1e6
    sent = requests + connect + timeout
    return {
        "driver": "wrk",
        "mode": "closed",
        "concurrency": connections,
        "duration_s": round(seconds, 3),
        "sent": sent,
        "ok": max(0, requests - status - read - write),
        "http_errors": {"non_2xx": status} if status else {},
        "transport_errors": transport,
        "throughput_rps": round(requests / seconds, 1) if seconds else 0.0,
        "latency_ms": {
            "p50": p50,
            "p90": p90,
            "p95": p95,
            "p99": p99,
            "p999": p999,
            "max": float(fields[9]) / 1000,
            "mean": float(fields[10]) / 1000,
        },
        "connections_used": connections,
    }


# -- Locust --------------------------------------------------------------------------------------------------
#: How long a user may take, once the run's time is up, to finish the request it has in flight.
_LOCUST_STOP_TIMEOUT_S = 30


def locustfile_source(path: str, bodies: list[bytes], host: str | None = None, stats_path: str | None = None) -> str:
    """A Locust file with one FastHttpUser that POSTs the given bodies in turn, as fast as answers come (S25).

    With `host` the file runs as it is (`locust -f FILE`); locust's own `--host` still overrides it. With
    `stats_path` it also writes its final statistics there as JSON when Locust quits (`bench --driver locust`).
    """
    literal = ",\n    ".join(repr(b.decode()) for b in bodies)
    usage = f"locust -f {{this file}}{'' if host else ' --host http://127.0.0.1:8000'}"
    host_line = f"    host = {host!r}\n" if host else ""
    source = f'''"""Generated by `twinserve locustfile`: load-test a twinserve model with Locust.

    {usage}
"""

import itertools

from locust import FastHttpUser, constant, task

BODIES = [
    {literal},
]
_next = itertools.cycle(BODIES)


class PredictUser(FastHttpUser):
{host_line}    wait_time = constant(0)  # closed loop: each user sends its next request when the last is answered

    @task
    def predict(self) -> None:
        self.client.post({path!r}, data=next(_next), headers={{"Content-Type": "application/json"}})
'''
    return source + (_LOCUST_STATS_HOOK % repr(stats_path) if stats_path else "")


#: Appended to the bench's Locust file. It ends the run `TWINSERVE_LOCUST_SECONDS` after Locust's statistics start
#: (`-t` counts from before Locust has finished starting up, and takes whole seconds only), and it writes the final
#: statistics, as Locust computes them, once every user stopped (the CSV files are rewritten once a second, so they
#: miss the run's last second).
_LOCUST_STATS_HOOK = """

import json
import os

import gevent
from locust import events
from locust.stats import PERCENTILES_TO_REPORT, StatsError


@events.test_start.add_listener
def _stop_after(environment, **kwargs) -> None:
    gevent.spawn_later(float(os.environ["TWINSERVE_LOCUST_SECONDS"]), environment.runner.quit)


@events.quitting.add_listener
def _save_statistics(environment, **kwargs) -> None:
    total = environment.runner.stats.total
    seconds = (total.last_request_timestamp or total.start_time) - total.start_time
    summary = {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "seconds": seconds,
        "percentiles_ms": {str(p): total.get_response_time_percentile(p) for p in PERCENTILES_TO_REPORT},
        "max_ms": total.max_response_time,
        "mean_ms": total.avg_response_time,
        "errors": [
            {"error": StatsError.parse_error(e.error), "occurrences": e.occurrences}
            for e in environment.runner.stats.errors.values()
        ],
    }
    with open(%s, "w") as f:
        json.dump(summary, f)
"""


def _locust(url: str, bodies: list[bytes], users: int, duration: float, warmup: float) -> dict[str, Any]:
    """Warm up in a run of its own, then measure a second run whole: the window the server counts too.

    Three things made Locust's count differ from the server's: `--reset-stats` resets once spawning ends (a
    second in, with the spawn rate at the user count), not after a warm-up, so the level missed that second; its
    CSV files are rewritten once a second, so the run's last second was missing too; at `-t` users were cut off
    with requests in flight that the server still answered; and `-t` counts from before Locust finished starting,
    so the window was short of the duration asked. Now every user starts at once (one dispatch), nothing is reset,
    the locustfile ends the run `duration` seconds after the statistics start, each user finishes its request in
    flight (`--stop-timeout`), and the statistics are Locust's final ones, written by the locustfile as it quits.
    """
    # Never imported here: importing locust monkey-patches this whole process with gevent.
    try:
        check_driver("locust")
    except ConfigError as exc:
        raise DriverError(str(exc)) from None
    base, path = url.split("/v1/", 1)
    with tempfile.TemporaryDirectory(prefix="twinserve-locust-") as tmp:
        locustfile = Path(tmp) / "locustfile.py"
        locustfile.write_text(locustfile_source("/v1/" + path, bodies, stats_path=str(Path(tmp) / "statistics.json")))
        if warmup > 0:
            _locust_run(locustfile, base, users, warmup)  # its statistics are dropped
        summary = _locust_run(locustfile, base, users, duration)
    failures: dict[str, int] = {}
    for fail in summary["errors"]:
        key = fail["error"].split("HTTPError(")[-1].split()[0].strip("'\")(") or "other"
        failures[key] = failures.get(key, 0) + int(fail["occurrences"])
    requests, failed, seconds = int(summary["requests"]), int(summary["failures"]), float(summary["seconds"])
    http = {k: v for k, v in failures.items() if k.isdigit()}
    transport = {
        "connect_refused": 0,
        "reset": 0,
        "timeout": 0,
        "other": sum(v for k, v in failures.items() if not k.isdigit()),
    }
    percentiles = summary["percentiles_ms"]
    ms = {k: _ms_or_none(percentiles.get(q)) for k, q in {"p50": "0.5", "p90": "0.9", "p95": "0.95", "p99": "0.99",
                                                         "p999": "0.999"}.items()}  # fmt: skip
    return {
        "driver": "locust",
        "mode": "closed",
        "concurrency": users,
        "duration_s": round(seconds, 3) if seconds > 0 else duration,
        "sent": requests,
        "ok": requests - failed,
        "http_errors": http,
        "transport_errors": transport,
        "throughput_rps": round(requests / seconds, 1) if seconds > 0 else 0.0,
        "latency_ms": {**ms, "max": _ms_or_none(summary["max_ms"]), "mean": _ms_or_none(summary["mean_ms"])},
        "connections_used": users,
    }


def _ms_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _locust_run(locustfile: Path, base: str, users: int, seconds: float) -> dict[str, Any]:
    """One headless Locust run of `seconds` from its statistics' start; its final statistics."""
    stats = locustfile.with_name("statistics.json")
    stats.unlink(missing_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(locustfile),
            "--headless",
            "--host",
            base,
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",  # a backstop only: the locustfile ends the run
            f"{math.ceil(seconds) + _LOCUST_STOP_TIMEOUT_S}s",
            "--stop-timeout",
            str(_LOCUST_STOP_TIMEOUT_S),
            "--only-summary",
            "--loglevel",
            "WARNING",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 2 * _LOCUST_STOP_TIMEOUT_S + 120,
        check=False,
        env={**os.environ, "TWINSERVE_LOCUST_SECONDS": str(seconds)},
    )
    if not stats.exists():
        raise DriverError(f"locust failed: {done.stderr.strip()[-1000:]}")
    summary: dict[str, Any] = orjson.loads(stats.read_bytes())
    return summary


# -- perf_analyzer -------------------------------------------------------------------------------------------
def _perf_analyzer(
    plan: BenchPlan, url: str, bodies: list[bytes], concurrency: int, grpc_target: str | None = None
) -> dict[str, Any]:
    installation = perf_analyzer.locate()
    if installation is None:
        raise DriverError(_NO_PERF_ANALYZER)
    version = "/v2/models/" if "/v2/models/" in url else "/v1/models/"
    base, rest = url.split(version, 1)
    model = rest.removesuffix(":predict").removesuffix("/infer")
    requests = [orjson.loads(body) for body in bodies]
    v2 = all(isinstance(r, dict) and "inputs" in r for r in requests)
    if not v2 and plan.payload is not None:
        raise DriverError(
            "--driver perf_analyzer sends V2 tensors: give --payload lines that are V2 inference requests "
            '({"inputs": [...]}), or none to send the model\'s examples()'
        )
    try:
        # Without a payload the bodies are V1 ones built from examples(), which only the model's code turns into
        # tensors: the server's own V2 example of the same examples() is sent instead.
        data = perf_analyzer.input_data(requests if v2 else [perf_analyzer.v2_example(base, model)])
        measured = perf_analyzer.measure(
            installation, base, model, data, [concurrency], plan.duration_s, plan.warmup_s, grpc_target=grpc_target
        )
    except perf_analyzer.PerfAnalyzerError as exc:
        raise DriverError(str(exc)) from None
    return measured.levels[0]
