"""Our load generator against wrk on the same endpoint: do the two instruments read the same, and is ours the limit?

Headline, neither side saturated: the raw ASGI baseline behind a fixed service time (`await asyncio.sleep`, 5 ms by
default), so a closed loop of N connections asks for about N / 5 ms requests a second and leaves the CPUs mostly idle.
At each connection count, wrk and `twinserve.lab.loadgen` (closed loop) run for the same duration over the same number
of keep-alive connections, one after another, in an order that rotates each round, for a few rounds. The summary gives
the median ratio (ours / wrk, paired within each round) of req/s, p50 and p99 per connection count, and whether they
agree within 10%.

wrk runs twice per round: with 2 threads, as the other benchmarks run it, and with 1 thread, like ours one event loop.
A closed loop on one event loop answers a burst of responses with a burst of requests, so the server sees burstier
load than from two loops interleaved, and queues a little more in the tail; wrk with 1 thread shows how much of a
p99 difference is that and not the instrument.

Secondary, saturated: the bare raw ASGI baseline, where the server is CPU-bound and shares the machine's cores with
whichever generator drives it, so each generator's own CPU cost comes out of the server's throughput.

    .venv/bin/python benchmarks/loadgen_vs_wrk.py --duration 5 [--connections 8,32,64] [--rounds 3] [--service-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from baselines import raw_asgi
from common import require_wrk

from twinserve.lab.loadgen import LoadSpec, run_level_sync
from twinserve.lab.servers import ServerProcess, free_port, http_ready

ROOT = Path(__file__).resolve().parent.parent
BODY = b'{"instances": [[5.1, 3.5, 1.4, 0.2]]}'
READY_TIMEOUT = 60.0
#: How the benchmark tells the server process its service time.
SERVICE_MS_ENV = "TWINSERVE_BENCH_SERVICE_MS"
SERVICE_S = float(os.environ.get(SERVICE_MS_ENV, "5")) / 1000
#: Ours / wrk within this of 1 counts as agreement.
TOLERANCE = 0.10
#: Above this share of one core a process counts as (close to) saturated.
BUSY_CPU_PERCENT = 80.0
#: Above this share of one core, taken by neither the server nor the generator, other work disturbed a run.
OTHER_CPU_PERCENT = 25.0
METRICS = ("rps", "p50", "p99")
OURS, WRK, WRK_1 = "ours", "wrk -t2", "wrk -t1"
_WRK_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}

Reading = dict[str, Any]


async def service_time_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The raw ASGI app after a fixed wait: a server whose pace is its service time, not its CPU."""
    if scope["type"] == "http":
        await asyncio.sleep(SERVICE_S)
    await raw_asgi.app(scope, receive, send)


@contextlib.contextmanager
def uvicorn(app: str, service_ms: float = 0.0) -> Iterator[tuple[str, psutil.Process]]:
    """`app` under uvicorn (one worker, uvloop + httptools) on a free port: a URL and its process, once it answers."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "--loop", "uvloop", "--http", "httptools", "--log-level", "warning",
        "--app-dir", str(ROOT / "benchmarks"), "--port", str(port), app,
    ]  # fmt: skip
    env = {SERVICE_MS_ENV: str(service_ms)}
    ready = http_ready("/health")
    with ServerProcess(command, port=port, ready=ready, env=env, cwd=ROOT, ready_timeout=READY_TIMEOUT) as server:
        yield f"{server.url}/predict", psutil.Process(server.pid)


def _wrk_ms(output: str, percentile: str) -> float:
    match = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)$", output, re.M)
    if match is None:
        raise RuntimeError(f"wrk output has no {percentile}% latency:\n{output}")
    return float(match.group(1)) * _WRK_UNITS_MS[match.group(2)]


def run_wrk(url: str, connections: int, seconds: float, threads: int) -> Reading:
    """wrk POSTing BODY over `connections` keep-alive connections from `threads` threads.

    `common.wrk` always takes min(connections, 2) threads; here the thread count is the variable under study.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(BODY.decode())}\n"
        )
    options = ["-t", str(threads), "-c", str(connections), "-d", f"{seconds:.0f}s", "--latency", "-s", script.name]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk is the only child to finish meanwhile
    started = time.perf_counter()
    try:
        output = subprocess.run(
            ["wrk", *options, url], capture_output=True, text=True, check=True, timeout=seconds + 60
        ).stdout
    finally:
        Path(script.name).unlink()
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - started
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.M)
    if rps is None:
        raise RuntimeError(f"wrk output has no Requests/sec:\n{output}")
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return {
        "rps": float(rps.group(1)),
        "p50": _wrk_ms(output, "50"),
        "p99": _wrk_ms(output, "99"),
        "errors": (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, socket.groups())) if socket else 0),
        "gen_cpu": 100 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / wall,
    }


def run_ours(url: str, connections: int, seconds: float) -> Reading:
    result = run_level_sync(LoadSpec(url, [BODY], duration_s=seconds, concurrency=connections))
    return {
        "rps": result.throughput_rps,
        "p50": result.latency_ms["p50"],
        "p99": result.latency_ms["p99"],
        "errors": sum(result.http_errors.values()) + sum(result.transport_errors.values()),
        "gen_cpu": result.generator_cpu_percent,
    }


def with_cpu(server: psutil.Process, measure: Callable[[], Reading]) -> Reading:
    """`measure()`, plus the server's CPU over it and that of everything but the server and the generator (other
    work on a shared machine), each as a percentage of one core."""
    psutil.cpu_percent()
    before, started = server.cpu_times(), time.perf_counter()
    result = measure()
    after, wall = server.cpu_times(), time.perf_counter() - started
    result["server_cpu"] = 100 * (after.user + after.system - before.user - before.system) / wall
    machine = psutil.cpu_percent() * (psutil.cpu_count() or 1)
    result["other_cpu"] = max(machine - result["server_cpu"] - result["gen_cpu"], 0.0)
    return result


@dataclass
class Round:
    """One round at one connection count: each instrument's reading, taken one after another."""

    index: int
    connections: int
    readings: dict[str, Reading]

    def ratio(self, metric: str, instrument: str, baseline: str) -> float:
        return float(self.readings[instrument][metric]) / float(self.readings[baseline][metric])

    @property
    def saturated(self) -> bool:
        """A server or a generator was busy enough that it may have set the pace."""
        keys = ("server_cpu", "gen_cpu")
        return float(max(reading[key] for reading in self.readings.values() for key in keys)) > BUSY_CPU_PERCENT

    @property
    def disturbed(self) -> bool:
        """Other work on the machine took enough CPU that it may have skewed one reading against another."""
        return float(max(reading["other_cpu"] for reading in self.readings.values())) > OTHER_CPU_PERCENT


def compare(
    url: str, server: psutil.Process, instruments: list[str], levels: list[int], rounds: int, seconds: float
) -> list[Round]:
    """Each instrument at each connection count, `rounds` times, in an order that rotates each round."""
    run_wrk(url, 8, 1, 2)  # warm-up, not reported
    results = []
    for index in range(rounds):
        order = instruments[index % len(instruments) :] + instruments[: index % len(instruments)]
        for connections in levels:
            readings: dict[str, Reading] = {}
            for instrument in order:
                measure = (
                    functools.partial(run_ours, url, connections, seconds)
                    if instrument == OURS
                    else functools.partial(run_wrk, url, connections, seconds, 1 if instrument == WRK_1 else 2)
                )
                readings[instrument] = with_cpu(server, measure)
            results.append(Round(index + 1, connections, readings))
    return results


def print_runs(rounds: list[Round]) -> None:
    header = (
        f"{'conns':>5} {'round':>5} {'instrument':>10} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'req/s, p50, p99 vs wrk -t2':>27} {'gen CPU%':>8} {'srv CPU%':>8} {'other CPU%':>10} {'errors':>6}"
    )
    print(header)
    print("-" * len(header))
    for round_ in sorted(rounds, key=lambda round_: round_.connections):
        for instrument, reading in round_.readings.items():
            ratios = (
                ", ".join(f"{round_.ratio(metric, instrument, WRK):.2f}" for metric in METRICS)
                if instrument != WRK
                else ""
            )
            print(
                f"{round_.connections:>5} {round_.index:>5} {instrument:>10} {reading['rps']:>8.0f} "
                f"{reading['p50']:>7.2f} {reading['p99']:>7.2f} {ratios:>27} {reading['gen_cpu']:>8.0f} "
                f"{reading['server_cpu']:>8.0f} {reading['other_cpu']:>10.0f} {reading['errors']:>6.0f}"
            )


def print_agreement(rounds: list[Round], levels: list[int], pairs: list[tuple[str, str]]) -> None:
    """Per connection count and pair of instruments: the median ratio of each metric, and whether all agree."""
    for connections in levels:
        level = [round_ for round_ in rounds if round_.connections == connections]
        notes = [
            f"{count} of {len(level)} rounds {what}"
            for count, what in (
                (sum(round_.saturated for round_ in level), f"had a server or generator over {BUSY_CPU_PERCENT:.0f}%"),
                (sum(round_.disturbed for round_ in level), f"had other work over {OTHER_CPU_PERCENT:.0f}% CPU"),
            )
            if count
        ]
        print(
            f"{connections} connections, medians over {len(level)} rounds" + (f" ({'; '.join(notes)})" if notes else "")
        )
        for instrument, baseline in pairs:
            medians = {
                metric: statistics.median(round_.ratio(metric, instrument, baseline) for round_ in level)
                for metric in METRICS
            }
            agree = all(abs(ratio - 1) <= TOLERANCE for ratio in medians.values())
            print(
                f"    {instrument} / {baseline}: "
                + ", ".join(f"{metric} {ratio:.3f}" for metric, ratio in medians.items())
                + f"; AGREE within {TOLERANCE:.0%}: {'yes' if agree else 'no'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (wrk rounds to 1 s)")
    parser.add_argument("--connections", default="8,32,64", help="comma-separated connection counts")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every instrument, fixed service time")
    parser.add_argument("--saturated-rounds", type=int, default=1, help="rounds against the bare server; 0 skips")
    parser.add_argument("--service-ms", type=float, default=5.0, help="the fixed service time of the headline server")
    args = parser.parse_args()
    require_wrk()
    levels = [int(part) for part in args.connections.split(",")]
    seconds = float(max(1, round(args.duration)))  # wrk takes whole seconds; give ours the very same
    cores = psutil.cpu_count() or 0

    with uvicorn("loadgen_vs_wrk:service_time_app", args.service_ms) as (url, server):
        unsaturated = compare(url, server, [WRK, WRK_1, OURS], levels, args.rounds, seconds)
    print(
        f"NEITHER SATURATED: raw ASGI + {args.service_ms:g} ms service time (uvicorn, 1 worker), "
        f"POST {len(BODY)} B JSON, {seconds:g} s per run, {cores} CPU cores; "
        "ideal req/s = " + ", ".join(f"{n / args.service_ms * 1000:.0f} at {n}" for n in levels)
    )
    print_runs(unsaturated)
    print_agreement(unsaturated, levels, [(OURS, WRK), (OURS, WRK_1), (WRK_1, WRK)])

    if args.saturated_rounds > 0:
        with uvicorn("baselines.raw_asgi:app") as (url, server):
            saturated = compare(url, server, [WRK, OURS], levels, args.saturated_rounds, seconds)
        print(f"\nSATURATED (secondary): bare raw ASGI (uvicorn, 1 worker), {seconds:g} s per run")
        print_runs(saturated)
        print(
            f"Caveat: here the server is CPU-bound and shares this machine's {cores} cores with the generator driving "
            "it (and with whatever else runs), so req/s measures how much CPU each generator leaves the server, "
            "which depends on its own cost (wrk: C, 2 threads; ours: one Python thread) and on how its threads are "
            "scheduled against the server's; ratios far from 1, either way, are expected and are not a disagreement "
            "between the instruments."
        )
    print(
        "\nratios are per round, paired; gen CPU% = the generator's (wrk's process, our generator's thread); "
        "srv CPU% = uvicorn's; other CPU% = everything else on the machine; all in % of one core."
    )


if __name__ == "__main__":
    main()
