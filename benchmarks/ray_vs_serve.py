"""`twinserve ray --replicas N` vs `twinserve serve --arch async --workers N`: the cost of Ray Serve's proxy hop.

Both serve the same model with the same async front and batcher in N processes; Ray adds its HTTP proxy actor in
front of the replicas (one more process and one more hop per request). Each setup is started the way users run it
(the CLI, as a subprocess, ready on `/v2/health/ready`), warmed up, and driven by wrk (Debian package `wrk`) at
several connection counts with the same POST body. The two setups alternate `--rounds` times so that drift on the
machine hits both. Prints req/s, P50/P99 and errors per round, then the mean of each and Ray's ratios against
serve (req/s ratio; P50 difference at one connection is the hop's latency). Figures are from this machine and
this run only: quote ratios, not absolutes.

    python benchmarks/ray_vs_serve.py [--model twinserve.examples.tabular:Classifier] [--connections 1,16,64]
                                      [--throughput-optimized]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

from common import Server, example_request, require_wrk, wrk

from twinserve.lab.servers import ServerProcess, free_port


class RayServer(ServerProcess):
    """`twinserve ray MODEL --replicas N` as a subprocess on a local Ray bounded to this machine's CPUs."""

    def __init__(self, model: str, replicas: str, env: dict[str, str] | None = None) -> None:
        port = free_port()  # Ray's proxy binds the port it is given and does not say another
        args = [sys.executable, "-m", "twinserve", "ray", model, "--port", str(port)]
        super().__init__(args, port=port, env={**os.environ, **(env or {})})
        self.args += ["--replicas", replicas]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--processes", default="2", help="serve workers and Ray replicas")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--throughput-optimized", action="store_true", help="also Ray with RAY_SERVE_THROUGHPUT_OPTIMIZED=1"
    )
    args = parser.parse_args()
    require_wrk()
    levels = [int(c) for c in args.connections.split(",")]
    serve_label, ray_label = f"serve async {args.processes}w", f"ray {args.processes} replicas"
    setups: dict[str, Callable[[], ServerProcess]] = {
        serve_label: lambda: Server([args.model], "async", "--workers", args.processes),
        ray_label: lambda: RayServer(args.model, args.processes),
    }
    if args.throughput_optimized:
        # Ray 2.56+'s opt-in: gRPC between deployments, direct ingress (no proxy actor), GC frozen after start-up.
        # Its HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY) binds every interface, so it is left out here.
        optimized = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
        setups[f"ray {args.processes} tput-opt"] = lambda: RayServer(args.model, args.processes, optimized)
    runs: dict[str, dict[int, list[dict[str, float]]]] = {label: {c: [] for c in levels} for label in setups}
    print(f"model {args.model}; wrk on the same machine; {args.rounds} alternating rounds of {args.seconds} s")
    print(f"{'round':>5} | {'conns':>5} | {'setup':>16} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | errors")
    for round_ in range(1, args.rounds + 1):
        for label, make in setups.items():
            with make() as server:
                url, body = example_request(server)
                wrk(url, body, 4, 2)  # warm-up
                for c in levels:
                    r = wrk(url, body, c, args.seconds)
                    runs[label][c].append(r)
                    print(
                        f"{round_:>5} | {c:>5} | {label:>16} | {r['rps']:>8.0f} | {r['p50']:>7.2f} | "
                        f"{r['p99']:>7.2f} | {r['errors']:.0f}",
                        flush=True,
                    )
    print(f"\nmean of {args.rounds} rounds; ratios are ray / serve")
    print(f"{'conns':>5} | {'setup':>16} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | req/s x | P50 x | P99 x")
    for c in levels:
        mean = {
            label: {k: statistics.fmean(r[k] for r in runs[label][c]) for k in ("rps", "p50", "p99")}
            for label in setups
        }
        for label, m in mean.items():
            base = mean[serve_label]
            print(
                f"{c:>5} | {label:>16} | {m['rps']:>8.0f} | {m['p50']:>7.2f} | {m['p99']:>7.2f} | "
                f"{m['rps'] / base['rps']:>7.2f} | {m['p50'] / base['p50']:>5.2f} | {m['p99'] / base['p99']:>5.2f}"
            )
    hop = statistics.fmean(r["p50"] for r in runs[ray_label][levels[0]])
    hop -= statistics.fmean(r["p50"] for r in runs[serve_label][levels[0]])
    print(f"\nRay's proxy hop at {levels[0]} connection(s): {hop:+.2f} ms on P50")


if __name__ == "__main__":
    main()
