"""Issue #15's three workloads in every architecture, for one or more checkouts side by side, in one run.

- forest: the built-in iris random forest (`twinserve.examples.tabular:Classifier`), 64 connections;
- minilm: all-MiniLM-L6-v2 embeddings (`twinserve.examples.embed:MiniLM`), 64 connections;
- io: a 50 ms wait per instance, then the forest (`benchmarks/wait_then_forest.py`), 256 connections.

The ceilings are measured first: Little's law for io (connections / 50 ms), the model's `predict` called in
process on full batches of 32 for the others (the better of one process with its math libraries' threads and
two at once with one math thread each). Each architecture runs with the settings
`benchmarks/peers.py` tunes (2 server processes, or 1 and 2 model workers, for the forest; one process for MiniLM,
whose torch already uses both cores). Each checkout (`--src DIR/src`, repeat it) serves in its own processes
through PYTHONPATH, on a port given to it (an old checkout may not announce the one it binds); checkouts alternate
per round, so the machine's drift hits each alike. Printed per workload and architecture: req/s, P50, P99, errors,
the server tree's CPU per request and its RSS (medians over rounds), each checkout's ratio to the first, and the
share of the ceiling. Run it alone: wrk shares the cores with the server.

    python benchmarks/workloads.py --src /tmp/before/src --src src [--workloads forest,minilm,io] [--rounds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from batching import ceiling
from common import ROOT, require_wrk, wrk
from cputime import tree_cpu_seconds
from peers import TUNED, example_body, tree_rss_mb

from twinserve.lab.servers import ServerProcess, free_port

WORKLOADS: dict[str, tuple[str, int]] = {  # MODEL, connections
    "forest": ("twinserve.examples.tabular:Classifier", 64),
    "minilm": ("twinserve.examples.embed:MiniLM", 64),
    "io": (f"{ROOT / 'benchmarks' / 'wait_then_forest.py'}:WaitThenForest", 256),
}
#: peers.py's tuned async and hybrid settings, and sync with as many server processes as async.
SETTINGS: dict[str, dict[str, list[str]]] = {
    workload: {"sync": TUNED[key]["async"], **TUNED[key]}
    for workload, key in (("forest", "tabular"), ("minilm", "minilm"), ("io", "tabular"))
}
WAIT_S = 0.05
CEILING_BATCH = 32


def in_process_ceiling(model: str) -> tuple[float, str]:
    """Predictions per second of `predict` called directly on full batches: the better of one process with the
    math libraries' own threads and two processes at once (the cores) with one math thread each."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        one = pool.submit(ceiling, model, CEILING_BATCH, 5.0).result()
    capped = dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), "1")
    saved = {name: os.environ.get(name) for name in capped}
    os.environ.update(capped)  # a spawned process reads them as its libraries start
    try:
        with ProcessPoolExecutor(2, mp_context=spawn) as pool:
            two = sum(pool.map(ceiling, [model] * 2, [CEILING_BATCH] * 2, [5.0] * 2))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if one >= two:
        return one, f"1 process: {one:,.0f}/s; 2 processes of 1 math thread: {two:,.0f}/s"
    return two, f"2 processes of 1 math thread: {two:,.0f}/s; 1 process: {one:,.0f}/s"


def serve(src: str, model: str, arch: str, flags: list[str]) -> ServerProcess:
    port = free_port()
    args = [sys.executable, "-m", "twinserve", "serve", model, "--arch", arch, "--host", "127.0.0.1"]
    args += ["--port", str(port), *flags]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    return ServerProcess(args, port=port, env=env, cwd=ROOT, ready_timeout=300)


def measure(src: str, workload: str, arch: str, seconds: float) -> dict[str, float]:
    model, connections = WORKLOADS[workload]
    with serve(src, model, arch, SETTINGS[workload][arch]) as server:
        url = f"{server.url}/v1/models/{_served_name(server)}:predict"
        body = example_body(model)
        wrk(url, body, connections, 3)  # warm-up: batches, pools, the libraries' threads
        cpu = tree_cpu_seconds(server.pid)
        result = wrk(url, body, connections, seconds)
        used = tree_cpu_seconds(server.pid) - cpu
        result["cpu_us"] = used / max(1.0, result["rps"] * seconds) * 1e6
        result["rss_mb"] = tree_rss_mb(server.pid)
        return result


def _served_name(server: ServerProcess) -> str:
    return str(httpx.get(f"{server.url}/v1/models", timeout=30).json()["models"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    parser.add_argument("--workloads", default="forest,minilm,io")
    parser.add_argument("--archs", default="sync,async,hybrid")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    require_wrk()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sources = args.src or [str(ROOT / "src")]
    archs = args.archs.split(",")
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for workload in args.workloads.split(","):
        limit = connections_limit(workload)
        for arch in archs:
            for round_ in range(args.rounds):
                for src in sources:  # alternating, so drift on a noisy machine hits every checkout alike
                    figures = measure(src, workload, arch, args.seconds)
                    results.setdefault((workload, arch, src), []).append(figures)
                    print(f"  {workload} {arch} round {round_ + 1} {src}: {_row(figures)}", flush=True)
        report(workload, archs, sources, results, limit)


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def _row(figures: dict[str, Any]) -> str:
    return (
        f"{figures['rps']:8.0f} req/s | P50 {figures['p50']:7.2f} ms | P99 {figures['p99']:7.2f} ms | "
        f"errors {figures['errors']:.0f} | {figures['cpu_us']:6.0f} us CPU/req | RSS {figures['rss_mb']:.0f} MB"
    )


def connections_limit(workload: str) -> float:
    """What the machine could do at most: Little's law for the wait, else the model in process (measured now,
    before the servers, with nothing else running)."""
    model, connections = WORKLOADS[workload]
    if workload == "io":
        limit, how = connections / WAIT_S, f"Little's law, {connections} / {WAIT_S * 1000:.0f} ms"
    else:
        limit, measured = in_process_ceiling(model)
        how = f"the model in process, full batches of {CEILING_BATCH}: {measured}"
    print(f"{workload}: ceiling {limit:,.0f} predictions/s ({how})", flush=True)
    return limit


def report(
    workload: str,
    archs: list[str],
    sources: list[str],
    results: dict[tuple[str, str, str], list[dict[str, float]]],
    limit: float,
) -> None:
    model, connections = WORKLOADS[workload]
    print(f"\n{workload} ({model}), {connections} connections, medians of rounds; ceiling {limit:,.0f}/s")
    for arch in archs:
        first = results[(workload, arch, sources[0])]
        for src in sources:
            rows = results[(workload, arch, src)]
            median = {key: _median(rows, key) for key in rows[0]}
            ratio = median["rps"] / _median(first, "rps")
            cpu = median["cpu_us"] / _median(first, "cpu_us")
            share = median["rps"] / limit
            print(f"{arch:>6} {src}: {_row(median)} | req/s x{ratio:.2f}, CPU x{cpu:.2f} | {share:.0%} of ceiling")
    print(flush=True)


if __name__ == "__main__":
    main()
