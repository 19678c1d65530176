"""CPU per batch of hybrid's pipe alone: a batch of iris instances (validated pydantic models) to a model worker
that returns them unchanged, and back, from the event loop, as `ProcessExecutor.arun` sends it. No front, no model
compute: what the hop to a model worker costs, in this process and the worker together. To compare checkouts,
name each one's `src/` with `--src`; they run alternately in subprocesses and the medians are printed.

    python benchmarks/pipe_cpu.py [--src OLD/src --src NEW/src] [--batches 300] [--batch 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from typing import Any

from cputime import tree_cpu_seconds

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


async def _measure(batches: int, size: int) -> float:
    """Microseconds of CPU per batch."""
    from twinserve.config import load_config
    from twinserve.core.executors import ModelHandle, ProcessExecutor
    from twinserve.examples.tabular import IrisFeatures
    from twinserve.model import ModelSpec, import_model

    target = "tests.models:Echo"
    config = load_config(arch="hybrid", model_workers=1, access_log=False, models=[target])
    executor = ProcessExecutor(ModelHandle(target, ModelSpec(import_model(target)()), config))
    await executor.astart()
    batch: list[Any] = [
        IrisFeatures(sepal_length=5.1, sepal_width=3.5, petal_length=1.4, petal_width=0.2) for _ in range(size)
    ]
    for _ in range(20):  # warm-up
        await executor.arun(batch)
    cpu = tree_cpu_seconds()
    for _ in range(batches):
        assert len(await executor.arun(batch)) == size
    used = tree_cpu_seconds() - cpu
    executor.close()
    return used / batches * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, ROOT)  # tests.models, imported by the model worker too
        print(asyncio.run(_measure(args.batches, args.batch)))
        return
    sources = args.src or [os.path.join(ROOT, "src")]
    figures: dict[str, list[float]] = {src: [] for src in sources}
    for _ in range(args.rounds):
        for src in sources:  # alternating, so drift on a noisy machine hits every checkout alike
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--batches", str(args.batches), "--batch", str(args.batch)],
                env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(src), os.path.abspath(ROOT)])},
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            figures[src].append(float(done.stdout.strip().splitlines()[-1]))
            print(f"  {src}: {figures[src][-1]:.0f} us", flush=True)
    base = statistics.median(figures[sources[0]])
    for src, values in figures.items():
        median = statistics.median(values)
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{src}: median {median:.0f} us CPU per batch of {args.batch} ({shown}); ratio to the first "
              f"{median / base:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
