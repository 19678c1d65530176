"""Does capping each computing process's math threads (`--model-threads`, default cores // processes) pay?

Per model and layout, the same server twice, side by side in rounds: with the default cap, and with
`--model-threads` = the cores (what every process ran with before the cap: each library's own default, one
thread per core). wrk at `--connections` over keep-alive connections; printed per layout: median req/s and P99
of the rounds, and capped / uncapped. A layout with one computing process gets the cores either way: it is the
reference. Not CI (minutes of load on every core): run it alone.

    python benchmarks/model_threads.py [--models minilm,tabular] [--seconds 10] [--rounds 2] [--connections 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from common import Server, require_wrk, warm_wrk

MODELS = {"minilm": "twinserve.examples.embed:MiniLM", "tabular": "twinserve.examples.tabular:Classifier"}
#: (label, arch, flags): layouts whose processes share the cores, and the one-process reference.
LAYOUTS = [
    ("async, 1 worker", "async", ["--workers", "1"]),
    ("async, 2 workers", "async", ["--workers", "2"]),
    ("hybrid, 2 model workers", "hybrid", ["--workers", "1", "--model-workers", "2"]),
]


def measure(model: str, arch: str, flags: list[str], seconds: float, connections: int) -> dict[str, float]:
    return warm_wrk(Server([model], arch, *flags), seconds, connections)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    require_wrk()
    cores = str(os.cpu_count() or 1)
    print(f"{'model':<8} {'layout':<26} {'capped req/s':>12} {'P99':>7} {'uncapped':>9} {'P99':>7} {'ratio':>6}")
    for name in args.models.split(","):
        for label, arch, flags in LAYOUTS:
            runs: dict[str, list[dict[str, float]]] = {"capped": [], "uncapped": []}
            for _ in range(args.rounds):  # alternated, so drift over the run falls on both
                runs["capped"].append(measure(MODELS[name], arch, flags, args.seconds, args.connections))
                uncapped = [*flags, "--model-threads", cores]
                runs["uncapped"].append(measure(MODELS[name], arch, uncapped, args.seconds, args.connections))
            rps = {k: statistics.median(r["rps"] for r in v) for k, v in runs.items()}
            p99 = {k: statistics.median(r["p99"] for r in v) for k, v in runs.items()}
            errors = sum(r["errors"] for v in runs.values() for r in v)
            print(
                f"{name:<8} {label:<26} {rps['capped']:>12,.1f} {p99['capped']:>7.1f} {rps['uncapped']:>9,.1f} "
                f"{p99['uncapped']:>7.1f} {rps['capped'] / rps['uncapped']:>6.2f}"
                + (f"  ({errors:.0f} errors)" if errors else ""),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
