"""Soak: hours of production traffic, compressed: N minutes at 70% of the measured capacity, per architecture.

Starts `twinserve serve MODEL` in each architecture (the CLI, as users run it), measures its capacity with a short
closed-loop run of the lab's load generator, then offers 70% of it in open loop (Poisson arrivals) for `--minutes`
minutes, one-minute windows back to back. Per window it records P50/P99 latency (coordinated-omission corrected),
errors, and the resident memory of the server's whole process tree. It reports the drift from the first minute to
the last: a server that leaks memory or slows down as it runs shows it here. Not part of CI (it takes minutes by
design); the hardening suite in tests/hardening is.

    python benchmarks/soak.py [--minutes 10] [--arch sync,async,hybrid] [--model twinserve.examples.tabular:Classifier]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import Server, example_request

from twinserve.lab.loadgen import LoadSpec, run_level_sync
from twinserve.lab.probe import tree_rss_mib

LOAD_SHARE = 0.70
WINDOW_S = 60.0


def soak(arch: str, model: str, minutes: int, window_s: float, flags: list[str]) -> dict[str, Any]:
    with Server([model], arch, *flags) as server:
        assert server.process is not None
        url, body = example_request(server)
        capacity = run_level_sync(LoadSpec(url=url, bodies=[body], duration_s=5, warmup_s=1, concurrency=32))
        rate = LOAD_SHARE * capacity.ok / capacity.duration_s
        windows: list[dict[str, Any]] = []
        for minute in range(minutes):
            level = run_level_sync(LoadSpec(url=url, bodies=[body], duration_s=window_s, rate=rate, seed=minute))
            errors = sum(level.http_errors.values()) + sum(level.transport_errors.values())
            window = {
                "window": minute + 1,
                "sent": level.sent,
                "errors": errors,
                "p50_ms": level.latency_ms["p50"],
                "p99_ms": level.latency_ms["p99"],
                "rss_mib": round(tree_rss_mib(server.process.pid), 1),
                "generator_limited": level.generator_limited,
            }
            windows.append(window)
            print(f"  {arch} window {minute + 1}: {json.dumps(window)}", flush=True)
    first, last = windows[0], windows[-1]
    return {
        "arch": arch,
        "capacity_rps": round(capacity.ok / capacity.duration_s, 1),
        "offered_rps": round(rate, 1),
        "minutes": minutes,
        "errors": sum(w["errors"] for w in windows),
        "rss_drift_pct": round(100 * (last["rss_mib"] - first["rss_mib"]) / first["rss_mib"], 1),
        "p99_drift_pct": round(100 * (last["p99_ms"] - first["p99_ms"]) / first["p99_ms"], 1),
        "windows": windows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--arch", default="sync,async,hybrid")
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--workers", default="1", help="server processes (model workers for hybrid)")
    parser.add_argument("--window-s", type=float, default=WINDOW_S, help="length of one measured window")
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = parser.parse_args()
    if args.minutes < 2:
        parser.error("--minutes must be at least 2: drift compares the first window with the last")
    results = []
    for arch in args.arch.split(","):
        flags = ["--workers", args.workers] if arch != "hybrid" else ["--workers", "1", "--model-workers", args.workers]
        results.append(soak(arch, args.model, args.minutes, args.window_s, flags))
    print(f"{'arch':8} {'capacity':>9} {'offered':>8} {'errors':>7} {'RSS drift':>10} {'P99 drift':>10}")
    for r in results:
        print(
            f"{r['arch']:8} {r['capacity_rps']:>8}/s {r['offered_rps']:>7}/s {r['errors']:>7} "
            f"{r['rss_drift_pct']:>9}% {r['p99_drift_pct']:>9}%"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
