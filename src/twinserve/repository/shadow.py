"""Shadow traffic: a request already answered by its primary version is computed again by the model's shadow
version (repository/traffic.py), off the request's path, and the two outputs are compared.

The primary's answer never waits for the shadow and never changes: `ShadowRunner.submit` only hands the job to a
bounded task set (event loop) or queue (sync threads), and a job that finds it full is dropped and counted. Each
outcome is counted in `twinserve_shadow_requests_total`, the latency difference in
`twinserve_shadow_latency_difference_seconds`; disagreements are logged at most once per `LOG_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twinserve.errors import TwinserveError
from twinserve.observability.metrics import REJECTION_REASONS, metrics

if TYPE_CHECKING:
    from twinserve.core.runtime import ModelRuntime

__all__ = ["ShadowJob", "ShadowRunner", "outputs_agree"]

logger = logging.getLogger("twinserve.shadow")

#: Jobs waiting for or being computed by shadow versions, per process, past which new ones are dropped.
CAPACITY = 64
#: Background threads computing the sync front's shadow jobs.
THREADS = 2
#: At most one log line per model and kind (disagreement, failure) this often.
LOG_INTERVAL_S = 10.0
#: How close two floats must be to agree (numpy's `allclose` defaults).
RTOL, ATOL = 1e-5, 1e-8


@dataclass(frozen=True)
class ShadowJob:
    """One answered request to compute again on the shadow version and compare."""

    model: str
    primary: str
    #: The shadow version's runtime.
    runtime: ModelRuntime
    instances: list[Any]
    outputs: list[Any]
    #: The primary's time from the request received to its outputs ready.
    primary_seconds: float


def outputs_agree(a: Any, b: Any) -> bool:
    """Whether two model outputs are the same: equal, with floats (and float arrays) numerically close."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)
    if hasattr(a, "__array__") or hasattr(b, "__array__"):
        return _arrays_agree(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(outputs_agree(a[k], b[k]) for k in a)
    if isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, str | bytes):
        return not isinstance(b, str | bytes) and len(a) == len(b) and all(map(outputs_agree, a, b))
    try:
        return bool(a == b)
    except Exception:  # an output type whose == raises (or returns something without a truth value)
        return False


def _arrays_agree(a: Any, b: Any) -> bool:
    import numpy as np

    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        return False
    if np.issubdtype(x.dtype, np.number) and np.issubdtype(y.dtype, np.number):
        return bool(np.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True))
    return bool(np.array_equal(x, y))


class ShadowRunner:
    """Computes shadow jobs off the requests' path, bounded (see the module docstring); one per process."""

    def __init__(self, capacity: int = CAPACITY, threads: int = THREADS) -> None:
        self._capacity = capacity
        self._threads = threads
        self._queue: queue.Queue[ShadowJob] = queue.Queue(maxsize=capacity)
        self._started = 0
        self._start_lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._logged: dict[str, tuple[float, int]] = {}  # model and kind -> (when last logged, how many not since)

    def submit(self, job: ShadowJob) -> None:
        """Compute `job` later, or count it dropped; never blocks."""
        if not job.runtime.occupancy.enter():  # being unloaded: it takes nothing new
            self._count(job, "dropped")
            return
        loop = _running_loop() if job.runtime.config.arch != "sync" else None
        if loop is not None:
            if len(self._tasks) >= self._capacity:
                self._drop(job)
                return
            # A context of its own: the answered request's must not take the shadow's batch or queue wait.
            task = loop.create_task(self._arun(job), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._start_threads()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._drop(job)

    async def _arun(self, job: ShadowJob) -> None:
        started = time.perf_counter()
        try:
            outputs = await job.runtime.apredict(job.instances, _deadline(job.runtime))
        except asyncio.CancelledError:
            job.runtime.occupancy.leave()
            raise
        except Exception as exc:
            self._failed(job, exc)
        else:
            self._compared(job, outputs, time.perf_counter() - started)
        job.runtime.occupancy.leave()

    def _run(self, job: ShadowJob) -> None:
        started = time.perf_counter()
        try:
            outputs = job.runtime.predict(job.instances, _deadline(job.runtime))
        except Exception as exc:
            self._failed(job, exc)
        else:
            self._compared(job, outputs, time.perf_counter() - started)
        finally:
            job.runtime.occupancy.leave()

    def _start_threads(self) -> None:
        if self._started >= self._threads:
            return
        with self._start_lock:  # started on first use: a forked gunicorn worker starts its own
            while self._started < self._threads:
                self._started += 1
                threading.Thread(target=self._serve, name=f"twinserve-shadow-{self._started}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            try:
                self._run(job)
            except Exception:  # counting or logging failed: the thread must go on serving
                logger.exception("shadow job for model %r failed", job.model)

    # -- outcomes -----------------------------------------------------------------------------------------
    def _drop(self, job: ShadowJob) -> None:
        job.runtime.occupancy.leave()
        self._count(job, "dropped")

    def _failed(self, job: ShadowJob, exc: Exception) -> None:
        # Refused by the shadow version's own admission (its queue full, its deadline): not computed, so dropped.
        refused = isinstance(exc, TwinserveError) and exc.code in REJECTION_REASONS
        self._count(job, "dropped" if refused else "error")
        if not refused:
            self._log(job, f"failed ({type(exc).__name__})", "failure(s)")

    def _compared(self, job: ShadowJob, outputs: Any, seconds: float) -> None:
        agree = outputs_agree(job.outputs, outputs)
        self._count(job, "agree" if agree else "disagree")
        shadow = job.runtime.spec.version
        metrics().shadow_difference.labels(job.model, job.primary, shadow).observe(seconds - job.primary_seconds)
        if not agree:
            self._log(job, f"disagreed with version {job.primary}", "disagreement(s)")

    def _count(self, job: ShadowJob, outcome: str) -> None:
        metrics().shadow.labels(job.model, job.primary, job.runtime.spec.version, outcome).inc()

    def _log(self, job: ShadowJob, what: str, counted: str) -> None:
        """One warning per model and kind of outcome per LOG_INTERVAL_S at most, saying how many were not logged;
        the outputs and the exception's text never: they may quote a client's data."""
        now = time.monotonic()
        key = f"{job.model}\0{counted}"
        last, quiet = self._logged.get(key, (-math.inf, 0))
        if now - last < LOG_INTERVAL_S:
            self._logged[key] = (last, quiet + 1)
            return
        self._logged[key] = (now, 0)
        logger.warning(
            "model %r: shadow version %s %s on a request of %d instance(s)%s",
            job.model,
            job.runtime.spec.version,
            what,
            len(job.instances),
            f" ({quiet} more {counted} not logged since the last line)" if quiet else "",
        )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop of this thread, if any. The sync architecture's runtimes compute on threads even when the
    caller is on a loop (its gRPC server's), so they always take the thread pool."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _deadline(runtime: ModelRuntime) -> float | None:
    """The shadow's deadline: its version's own `timeout_ms`, from now (None: none)."""
    timeout_ms = runtime.config.timeout_ms
    return None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
