"""Our load generator against wrk on one fast endpoint: do the two instruments read the same, and is ours the limit?

Starts the raw ASGI baseline (uvicorn, one worker, uvloop + httptools), then at each connection count runs wrk and
`twinserve.lab.loadgen` (closed loop) for the same duration over the same number of keep-alive connections,
alternating, and prints both side by side with the CPU each side of the wire used.

    .venv/bin/python benchmarks/loadgen_vs_wrk.py --duration 5 [--connections 8,32,64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
from common import require_wrk, wrk
from tests.serving import free_port

from twinserve.lab.loadgen import LoadSpec, run_level_sync

ROOT = Path(__file__).resolve().parent.parent
BODY = b'{"instances": [[5.1, 3.5, 1.4, 0.2]]}'
READY_TIMEOUT = 60.0


@contextlib.contextmanager
def raw_asgi() -> Iterator[tuple[str, psutil.Process]]:
    """The raw ASGI app under uvicorn on a free port: its predict URL and its process, once /health answers."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "--loop", "uvloop", "--http", "httptools", "--log-level", "warning",
        "--port", str(port), "benchmarks.baselines.raw_asgi:app",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"uvicorn never became ready:\n{log.read().decode(errors='replace')}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                time.sleep(0.05)  # polling interval while waiting on readiness
            yield f"http://127.0.0.1:{port}/predict", psutil.Process(process.pid)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def with_server_cpu(server: psutil.Process, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`measure()`, plus the server's CPU over it as a percentage of one core."""
    before, started = server.cpu_times(), time.perf_counter()
    result = measure()
    after, wall = server.cpu_times(), time.perf_counter() - started
    result["server_cpu"] = 100 * (after.user + after.system - before.user - before.system) / wall
    return result


def ours(url: str, connections: int, seconds: float) -> dict[str, Any]:
    result = run_level_sync(LoadSpec(url, [BODY], duration_s=seconds, concurrency=connections))
    errors = sum(result.http_errors.values()) + sum(result.transport_errors.values())
    return {
        "rps": result.throughput_rps,
        "p50": result.latency_ms["p50"],
        "p99": result.latency_ms["p99"],
        "errors": errors,
        "cpu": result.generator_cpu_percent,
        "limited": result.generator_limited,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (wrk rounds to 1 s)")
    parser.add_argument("--connections", default="8,32,64", help="comma-separated connection counts")
    parser.add_argument("--rounds", type=int, default=1, help="alternating wrk/ours rounds per connection count")
    args = parser.parse_args()
    require_wrk()
    levels = [int(part) for part in args.connections.split(",")]
    seconds = float(max(1, round(args.duration)))  # wrk takes whole seconds; give ours the very same

    rows = []
    with raw_asgi() as (url, server):
        wrk(url, BODY, 8, 2)  # warm-up, not reported
        for _ in range(args.rounds):
            for connections in levels:
                theirs = with_server_cpu(server, functools.partial(wrk, url, BODY, connections, seconds))
                mine = with_server_cpu(server, functools.partial(ours, url, connections, seconds))
                rows.append((connections, theirs, mine))

    cores = psutil.cpu_count() or 0
    print(f"raw ASGI (uvicorn, 1 worker), POST {len(BODY)} B JSON, {seconds:g} s per run, {cores} CPU cores")
    header = (
        f"{'conns':>5} {'wrk req/s':>10} {'ours req/s':>10} {'ratio':>6} {'wrk p50':>8} {'wrk p99':>8} "
        f"{'ours p50':>8} {'ours p99':>8} {'gen CPU%':>8} {'limited':>7} {'srv CPU% w/o':>13} {'errs w/o':>9}"
    )
    print(header)
    print("-" * len(header))
    for connections, theirs, mine in rows:
        print(
            f"{connections:>5} {theirs['rps']:>10.0f} {mine['rps']:>10.0f} {mine['rps'] / theirs['rps']:>6.2f} "
            f"{theirs['p50']:>8.2f} {theirs['p99']:>8.2f} {mine['p50']:>8.2f} {mine['p99']:>8.2f} "
            f"{mine['cpu']:>8.0f} {mine['limited']!s:>7} "
            f"{theirs['server_cpu']:>6.0f}/{mine['server_cpu']:<6.0f} {theirs['errors']:>4.0f}/{mine['errors']:<4}"
        )
    print(
        "latencies in ms; ratio = ours / wrk; gen CPU% = our generator's thread, % of one core; "
        "srv CPU% = uvicorn's, during wrk / during ours.\n"
        f"Caveat: on this {cores}-core machine the load generator and the server share the cores, so each "
        "instrument's own CPU cost comes out of the server's; wrk (C, 2 threads) costs less per request than one "
        "Python thread, which lowers our req/s where the server is CPU-bound, not where the server is the limit."
    )


if __name__ == "__main__":
    main()
