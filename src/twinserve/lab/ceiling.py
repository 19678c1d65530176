"""The model's own inference time per batch size, in one process with no server: the ceiling no server beats.

Optionally per math-thread cap too: a server caps each computing process's math threads at its share of the cores
(`twinserve.core.threads`), so two MiniLM processes on two cores each compute on one thread, and what they can
serve together follows from the one-thread curve, not from the curve of one process owning both cores.

Run as `python -m twinserve.lab.ceiling MODEL BODIES.jsonl SIZES OUT.json [SECONDS [THREADS]]` in a process of its
own, so the model's memory leaves with it (and its prints cannot mix with the result).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from twinserve.lab.results import Ceiling

__all__ = [
    "MULTI_THREADED",
    "curve",
    "machine_ceiling",
    "measure",
    "measure_in_subprocess",
    "process_counts",
    "room",
    "thread_caps",
]


#: A model whose predict keeps fewer cores than this busy computes on one thread: a cap changes nothing for it.
MULTI_THREADED = 1.3
#: Seconds to wait after lowering a cap, before measuring under it.
SETTLE_S = 0.5


def process_counts(cpus: int) -> list[int]:
    """The computing-process counts worth trying on `cpus` cores: one, half the cores, every core."""
    return sorted({1, max(1, cpus // 2), cpus})


def room(cpus: int, cores: float) -> int:
    """How many processes whose predict keeps `cores` cores busy run side by side on `cpus` cores (at least one:
    2 cores / 1.99 busy is one process)."""
    return max(1, round(cpus / max(cores, 1.0)))


def thread_caps(cpus: int) -> list[int]:
    """The math-thread caps a server gives its computing processes, largest first: the cores over each process
    count, and one (sync's request threads that each call predict); none where the user set a library's threads:
    the server leaves those alone too."""
    from twinserve.core.threads import user_chose_threads

    if user_chose_threads():
        return []
    return sorted({max(1, cpus // n) for n in process_counts(cpus)} | {1}, reverse=True)


def curve(rows: Sequence[Ceiling], threads: int | None = None) -> list[Ceiling]:
    """The batch curve measured under the largest math-thread cap up to `threads` (None: the largest measured). A
    model that computes on one thread was measured once: that curve serves every cap."""
    # No cap (None: the libraries' own count) ranks above every cap; it is never measured beside caps.
    ranked = sorted({c.threads for c in rows}, key=lambda t: math.inf if t is None else t)
    fitting = [t for t in ranked if threads is None or (t is not None and t <= threads)]
    chosen = fitting[-1] if fitting else ranked[0]
    return [c for c in rows if c.threads == chosen]


def machine_ceiling(rows: Sequence[Ceiling], cpus: int) -> tuple[float, int, Ceiling] | None:
    """The most instances/s the model computes in-process on `cpus` cores: for each measurement, as many processes
    as its busy cores leave room for, times its rate; (instances/s, processes, the measurement). Two processes
    capped at a thread each can beat one on both cores; a single-threaded model's measurement counts once per
    core."""
    best: tuple[float, int, Ceiling] | None = None
    for row in rows:
        processes = room(cpus, row.cores)
        if best is None or processes * row.instances_per_s > best[0]:
            best = (processes * row.instances_per_s, processes, row)
    return best


def measure(
    model: str, bodies: list[bytes], sizes: list[int], budget_s: float = 2.0, threads: Sequence[int] = ()
) -> list[Ceiling]:
    """Load `model`, then time `predict` on batches of each size built from the bodies' instances: as its libraries
    run by default, or, with `threads`, under each of these math-thread caps, largest first (a cap only lowers). The
    smaller caps are skipped when the first left predict on about one core."""
    from twinserve.config import load_config
    from twinserve.core.device import resolve_device
    from twinserve.core.hooks import call_blocking
    from twinserve.core.threads import cap_threads
    from twinserve.model import ModelSpec, import_model
    from twinserve.protocol.v1 import V1Codec

    instance = import_model(model)()
    config = load_config()
    with contextlib.suppress(AttributeError):  # as the server does: settings from TWINSERVE_* (a Redis URL, say)
        instance.config = config
    with contextlib.suppress(AttributeError):  # and where to compute (TWINSERVE_DEVICE), before load() too
        instance.device = resolve_device(config.device)
    spec = ModelSpec(instance)
    codec = V1Codec(spec.name, spec.input_type, spec.output_type)
    if spec.load is not None:
        call_blocking(spec.load)
    pool: list[Any] = [i for body in bodies for i in codec.decode(body)]
    if spec.preprocess is not None:
        pool = [call_blocking(spec.preprocess, i) for i in pool]
    rows: list[Ceiling] = []
    caps: list[int | None] = [*sorted(set(threads), reverse=True)] or [None]
    for cap in caps:
        if cap is not None:
            if rows and max(r.cores for r in rows) < MULTI_THREADED:
                break
            cap_threads(cap)
            # The threads a cap retires spin a while before they sleep (OpenBLAS does), and that CPU time would
            # count as this cap's cores.
            time.sleep(SETTLE_S)
        rows += _time_batches(spec.predict, pool, sizes, budget_s, cap)
    return rows


def _time_batches(predict: Any, pool: list[Any], sizes: list[int], budget_s: float, cap: int | None) -> list[Ceiling]:
    from twinserve.core.hooks import call_blocking

    rows: list[Ceiling] = []
    for size in sizes:
        batch = [pool[i % len(pool)] for i in range(size)]
        call_blocking(predict, batch)  # warm-up: lazy initialisation, caches
        timings: list[float] = []
        spent_until = time.perf_counter() + budget_s
        # Every thread of this process (what predict's libraries use) over the loop's wall time, not over predict's
        # alone: the loop's own CPU would otherwise count as extra cores for a model that predicts in microseconds.
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        while len(timings) < 5 or (time.perf_counter() < spent_until and len(timings) < 1000):
            started = time.perf_counter()
            call_blocking(predict, batch)
            timings.append(time.perf_counter() - started)
        cores = (time.process_time() - cpu_started) / max(time.perf_counter() - wall_started, 1e-9)
        median = statistics.median(timings)
        rows.append(
            Ceiling(
                batch_size=size,
                batch_ms_median=round(median * 1000, 4),
                instances_per_s=round(size / median, 1),
                cores=round(max(cores, 0.01), 2),
                threads=cap,
            )
        )
    return rows


def measure_in_subprocess(
    model: str,
    bodies: list[bytes],
    sizes: list[int],
    scratch: Path,
    budget_s: float = 2.0,
    search_path: Path | None = None,
    threads: Sequence[int] = (),
) -> list[Ceiling]:
    """`measure` in a process of its own; `budget_s` per batch size and thread cap. `search_path`: a folder the
    model's file imports its neighbours from (a repository version's), put first on the subprocess's PYTHONPATH."""
    path, out = scratch / "ceiling-bodies.jsonl", scratch / "ceiling.json"
    path.write_bytes(b"\n".join(bodies))
    sizes_arg = ",".join(map(str, sizes))
    env = None
    if search_path is not None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(search_path), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "twinserve.lab.ceiling", model, str(path), sizes_arg, str(out), str(budget_s)]
        + ([",".join(map(str, threads))] if threads else []),
        capture_output=True,
        timeout=600,
        check=False,
        env=env,
    )
    path.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"measuring the model in-process failed:\n{done.stderr.decode(errors='replace')[-2000:]}")
    rows = [Ceiling.model_validate(row) for row in orjson.loads(out.read_bytes())]
    out.unlink()
    return rows


if __name__ == "__main__":
    target, bodies_file, sizes_arg, out_file = sys.argv[1:5]
    budget = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    caps = [int(t) for t in sys.argv[6].split(",")] if len(sys.argv) > 6 else []
    sizes = [int(s) for s in sizes_arg.split(",")]
    rows = measure(target, Path(bodies_file).read_bytes().splitlines(), sizes, budget, caps)
    Path(out_file).write_bytes(orjson.dumps([row.model_dump() for row in rows]))
