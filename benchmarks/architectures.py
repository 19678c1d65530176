"""Sync vs async vs hybrid on the same model and the same load, side by side in one run.

Starts `twinserve serve MODEL` in each architecture with its default settings (the CLI, as users run it; async
once with the seed's single worker and once with as many workers as sync; hybrid with one server process and as
many model workers), drives each with wrk (Debian package `wrk`) at several connection counts with the same POST
body, and prints req/s, P50/P99 latency, errors and the throughput ratio against sync per level. Figures are
from this machine and this run only: quote ratios, not absolutes.

    python benchmarks/architectures.py [--model twinserve.examples.tabular:Classifier] [--connections 1,16,64]
"""

from __future__ import annotations

import argparse

from common import Server, example_request, require_wrk, wrk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", default="2", help="server processes for sync and the second async setup")
    args = parser.parse_args()
    require_wrk()
    levels = [int(c) for c in args.connections.split(",")]
    setups = {
        f"sync {args.workers}w": ("sync", ["--workers", args.workers]),  # gunicorn gthread, 4 threads per worker
        "async 1w": ("async", ["--workers", "1"]),  # the seed's `uvicorn --workers 1 --loop uvloop`
        f"async {args.workers}w": ("async", ["--workers", args.workers]),  # same process count as sync
        f"hybrid {args.workers}mw": ("hybrid", ["--workers", "1", "--model-workers", args.workers]),
    }
    results: dict[str, dict[int, dict[str, float]]] = {}
    for label, (arch, extra) in setups.items():
        with Server([args.model], arch, *extra) as server:
            url, body = example_request(server)
            wrk(url, body, 4, 2)  # warm-up
            results[label] = {c: wrk(url, body, c, args.seconds) for c in levels}
    baseline = next(iter(setups))
    print(f"model {args.model}; wrk on the same machine; ratios against {baseline!r}")
    print(f"{'conns':>5} | {'setup':>10} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | {'errors':>6} | ratio")
    for c in levels:
        for label, by_level in results.items():
            r = by_level[c]
            ratio = r["rps"] / results[baseline][c]["rps"]
            print(
                f"{c:>5} | {label:>10} | {r['rps']:>8.0f} | {r['p50']:>7.2f} | {r['p99']:>7.2f} | "
                f"{r['errors']:>6.0f} | {ratio:.2f}"
            )


if __name__ == "__main__":
    main()
