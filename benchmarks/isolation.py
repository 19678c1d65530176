"""What failure isolation costs: predict re-runs per poisoned batch, and what one re-run adds per executor.

1. Re-runs: the bisection policy (`twinserve.core.isolation`) over batches of m one-instance requests with k
   failing ones at random positions: mean and worst re-runs against the 2·k·⌈log2 m⌉ bound.
2. One re-run's overhead besides predict itself: an in-process call (thread executor) and a call to a hybrid
   model worker (pickled over a pipe and back), both on the same echo model and batch; the ratio is what running
   the bisection in the server process, rather than inside the model worker, costs per re-run.

    python benchmarks/isolation.py [--calls 2000] [--batch 16]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

from twinserve.config import Config
from twinserve.core.executors import ModelHandle, ProcessExecutor, ThreadExecutor
from twinserve.core.isolation import bisect
from twinserve.errors import ModelFailed
from twinserve.model import ModelSpec, import_model

ECHO = f"{Path(__file__).resolve().parent.parent / 'tests' / 'models.py'}:Echo"


def reruns_table(trials: int = 300) -> None:
    rng = random.Random(0)
    print(f"{'m':>4} {'k':>3} | {'mean re-runs':>12} {'worst':>6} {'bound':>6}")
    for m in (8, 32, 128):
        for k in (1, 2, 4):
            counts = []
            for _ in range(trials):
                bad = set(rng.sample(range(m), k))

                def run(batch: list[Any], bad: set[int] = bad) -> list[Any]:
                    if bad & set(batch):
                        raise ModelFailed("poisoned")
                    return batch

                counts.append(bisect(run, [[r] for r in range(m)], ModelFailed("poisoned"), 10_000).reruns)
            bound = 2 * k * math.ceil(math.log2(m))
            print(f"{m:>4} {k:>3} | {statistics.mean(counts):>12.1f} {max(counts):>6} {bound:>6}")


def per_call_us(call: Any, batch: list[Any], calls: int) -> float:
    for _ in range(calls // 10):
        call(batch)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call(batch)
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    reruns_table()
    config = Config(models=[ECHO], arch="hybrid")
    handle = ModelHandle(ECHO, ModelSpec(import_model(ECHO)()), config)
    batch = [{"instance": i, "values": [0.5] * 4} for i in range(args.batch)]
    thread, process = ThreadExecutor(handle), ProcessExecutor(handle)
    process.start()
    try:
        in_process = per_call_us(thread.run, batch, args.calls)
        worker = per_call_us(process.run, batch, args.calls)
    finally:
        process.close()
        thread.close()
    print(f"\none call of a {args.batch}-instance echo batch (median of 5 x {args.calls}):")
    print(f"  in process (thread executor): {in_process:8.1f} us")
    ratio, extra = worker / in_process, worker - in_process
    print(f"  hybrid model worker (pipe):   {worker:8.1f} us   ({ratio:.0f}x, +{extra:.0f} us per re-run)")


if __name__ == "__main__":
    main()
