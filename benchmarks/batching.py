"""What dynamic batching buys: the same server with batching off (max batch 1) and on, in one run.

For each model: its in-process ceiling first (predict called directly on batches of 1 and of 32, no HTTP: the
most batching could ever give), then `twinserve serve MODEL --arch async` with `--max-batch-size 1` and with
batching on, each driven by wrk at 32 connections with the same one-instance body. Prints req/s, P50/P99 and
the on/off throughput ratio next to the ceiling ratio. The seed claims "up to 300%"; this reports what holds.

    python benchmarks/batching.py [--models twinserve.examples.tabular:Classifier,twinserve.examples.embed:MiniLM]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from common import Server, example_request, require_wrk, wrk

from twinserve.config import load_config
from twinserve.core.device import resolve_device
from twinserve.model import ModelSpec, import_model


def ceiling(target: str, batch_size: int, seconds: float = 3.0) -> float:
    """Instances per second when `predict` is called directly on full batches (one thread, this process)."""
    model = import_model(target)()
    model.config = load_config()
    model.device = resolve_device(model.config.device)  # as the server gives it before load
    spec = ModelSpec(model)
    if spec.load is not None:
        spec.load.fn()
    examples: list[Any] = spec.examples()
    batch = [examples[i % len(examples)] for i in range(batch_size)]
    spec.predict.fn(batch)  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        spec.predict.fn(batch)
        done += batch_size
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="twinserve.examples.tabular:Classifier,twinserve.examples.embed:MiniLM")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--max-batch-size", default="32")
    args = parser.parse_args()
    require_wrk()
    rows = []
    for target in args.models.split(","):
        one, full = ceiling(target, 1), ceiling(target, int(args.max_batch_size))
        measured = {}
        for label, size in (("off", "1"), ("on", args.max_batch_size)):
            with Server([target], "async", "--workers", "1", "--max-batch-size", size) as server:
                url, body = example_request(server)
                wrk(url, body, 4, 2)  # warm-up
                measured[label] = wrk(url, body, args.connections, args.seconds)
        rows.append((target.rsplit(":", 1)[1], one, full, measured))
    print(f"async, 1 worker, wrk {args.connections} connections, {args.seconds:g} s; max batch {args.max_batch_size}")
    print(f"{'model':>10} | {'batching':>8} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | {'errors':>6} | on/off")
    for name, one, full, measured in rows:
        for label in ("off", "on"):
            r = measured[label]
            ratio = f"{measured['on']['rps'] / measured['off']['rps']:.2f}x" if label == "on" else ""
            print(
                f"{name:>10} | {label:>8} | {r['rps']:>8.0f} | {r['p50']:>7.2f} | {r['p99']:>7.2f} | "
                f"{r['errors']:>6.0f} | {ratio}"
            )
        print(
            f"{name:>10} | ceiling: {one:,.0f}/s at batch 1, {full:,.0f}/s at batch {args.max_batch_size} "
            f"({full / one:.1f}x) in-process; served with batching = {measured['on']['rps'] / full:.0%} of it"
        )


if __name__ == "__main__":
    main()
