"""How many threads a model's math libraries may use in one process: the cores, shared among the processes that
run predict.

torch, OpenBLAS, MKL and OpenMP each start one thread per core in every process that uses them. Two server
processes computing MiniLM on two cores then run four busy threads on two cores, and each batch waits on the
other's: more context switches and cache misses, not more work done. Ray Serve gives each replica
`OMP_NUM_THREADS` = its CPUs; Triton has a per-model `intra_op_thread_count`. twinserve caps each computing
process at `--model-threads` (default: cores // processes that run predict; left alone when the user set
`OMP_NUM_THREADS`), after the model's `load()` has imported its libraries and before its first batch: torch's
own setting, and threadpoolctl for the BLAS and OpenMP runtimes loaded by then. OpenMP's setting (libgomp's, which
scikit-learn and torch load) is the calling thread's own, so each thread that runs predict sets it again before its
first batch (`cap_this_thread`, from `Placement.computing`); torch re-applies its own in each thread itself.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["cap_this_thread", "limit_threads", "math_threads"]

logger = logging.getLogger("twinserve.threads")

#: This process's cap, once `limit_threads` set one.
_cap: int | None = None
_local = threading.local()


def limit_threads(threads: int | None) -> None:
    """Cap the math libraries this process has loaded at `threads` each (None: leave them as they are)."""
    global _cap
    if threads is None:
        return
    _cap = threads
    _local.capped = threads
    torch = sys.modules.get("torch")  # only if the model imported it: never import torch for this
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency, so always there

    threadpool_limits(limits=threads)
    logger.debug("math libraries limited to %d thread(s) in this process", threads)


def cap_this_thread() -> None:
    """The process's cap in this thread too (OpenMP's setting is per thread): once per thread, a check after."""
    if _cap is None or getattr(_local, "capped", None) == _cap:
        return
    _local.capped = _cap
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=_cap, user_api="openmp")


def math_threads() -> dict[str, int]:
    """What each math library loaded in this process runs with now (torch's, and threadpoolctl's view)."""
    from threadpoolctl import threadpool_info

    found = {f"{info['internal_api']}:{info['prefix']}": int(info["num_threads"]) for info in threadpool_info()}
    torch = sys.modules.get("torch")
    if torch is not None:
        found["torch"] = int(torch.get_num_threads())
    return found
