"""How many threads a model's math libraries may use where predict runs: the usable cores, shared among the
predicts the server runs at once.

torch, OpenBLAS, MKL and OpenMP each start one thread per core in every process, so several processes computing
at once oversubscribe the cores: more context switches and cache misses, not more work. twinserve caps them at
`--model-threads`, by default the usable cores (CPU affinity and cgroup quota) over the predicts that can run at
once. A derived cap only lowers a library's count; a user's own `OMP_NUM_THREADS` etc. is left alone. OpenMP's
setting is per thread, so each thread that runs predict applies the cap again (`cap_this_thread`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from twinserve.config import Config

__all__ = [
    "USER_THREAD_VARS",
    "cap_this_thread",
    "cap_threads",
    "limit_threads",
    "model_threads",
    "usable_cores",
    "user_chose_threads",
]

logger = logging.getLogger("twinserve.threads")

#: A user who set one of these chose their math libraries' threads: twinserve leaves every library alone then.
USER_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: cgroup v2's CPU quota of this process's group: "max 100000", or "QUOTA PERIOD" under a CPU limit.
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


class _Cap:
    """This process's cap once `limit_threads` set one; `exact`: `--model-threads` said it (may raise a count)."""

    threads: int | None = None
    exact = False
    #: Bumped by each `limit_threads`, so that every thread applies the newest cap once.
    generation = 0


_local = threading.local()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (`taskset`, a cpuset), lowered to a cgroup v2 CPU quota
    (a Kubernetes `limits.cpu`: 1.5 CPUs is one core's worth of busy threads, at least one)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity outside Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2 here, or a file this code does not know
        pass
    return cores


def user_chose_threads() -> bool:
    """Whether the user set a math library's threads (`USER_THREAD_VARS`): then twinserve caps nothing."""
    return any(os.environ.get(name) for name in USER_THREAD_VARS)


def model_threads(config: Config, executor: str) -> int | None:
    """The cap for a process of this server whose predicts run in `executor` ("process": one at a time in each
    model worker; "request-thread": in each of the sync front's request threads; else in each of the model
    workers' threads); None: the user chose the libraries' threads themselves."""
    if config.model_threads is not None:
        return config.model_threads
    if user_chose_threads():
        return None
    at_once = config.threads if executor == "request-thread" else config.model_workers
    return max(1, usable_cores() // (config.effective_workers * at_once))


def limit_threads(config: Config, executor: str) -> int | None:
    """Cap the math libraries this process has loaded (see `model_threads`); returns the cap, None if none."""
    threads = model_threads(config, executor)
    if threads is None:
        return None
    cap_threads(threads, exact=config.model_threads is not None)
    return threads


def cap_threads(threads: int, *, exact: bool = False) -> None:
    """Cap this process's math libraries at `threads`: only where a library's own count is above it, or to exactly
    `threads` (`exact`); in the calling thread now, in every other thread before its next batch."""
    _Cap.threads, _Cap.exact = threads, exact
    _Cap.generation += 1
    _apply()
    logger.debug("math libraries limited to %d thread(s) in this process", threads)


def cap_this_thread() -> None:
    """The process's cap in this thread too (OpenMP's setting is per thread): once per thread, a check after."""
    if _Cap.threads is None or getattr(_local, "generation", None) == _Cap.generation:
        return
    _apply()


def _apply() -> None:
    """The cap in the calling thread: torch's, and every BLAS and OpenMP runtime loaded (threadpoolctl); a derived
    cap only where a library's count is above it."""
    threads, exact = _Cap.threads, _Cap.exact
    assert threads is not None
    _local.generation = _Cap.generation
    torch = sys.modules.get("torch")  # only if the model imported it: never import torch for this
    if torch is not None and (torch.get_num_threads() > threads or (exact and torch.get_num_threads() != threads)):
        torch.set_num_threads(threads)
    from threadpoolctl import threadpool_info, threadpool_limits  # scikit-learn's dependency, so always there

    over = {info["prefix"] for info in threadpool_info() if exact or info["num_threads"] > threads}
    if over:
        threadpool_limits(limits=dict.fromkeys(over, threads))
