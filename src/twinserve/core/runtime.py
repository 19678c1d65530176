"""One model in one process: load it once, then preprocess, batch and predict, from threads or an event loop.

`ModelRuntime` knows nothing of HTTP. The sync front calls `predict`, the async fronts await `apredict`; both
run the same hooks, admission and batching policy, and raise the same errors. Without batching predict runs in
the request thread (S3); with it a `ThreadBatcher` (sync) or `AsyncBatcher` (async, hybrid) gathers batches. A
streaming model's `stream` / `astream` skip the batcher: one generator call per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from twinserve.config import Config
from twinserve.core.batch_queue import BatchQueue
from twinserve.core.batcher import AsyncBatcher, BatchStats, ThreadBatcher, deadline_passed
from twinserve.core.bridge import run_in_daemon_thread, run_in_executor
from twinserve.core.cache import Lookup, ResponseCache
from twinserve.core.device import Placement, device_for
from twinserve.core.executors import EXECUTORS, Executor, ModelHandle, resolve_executor
from twinserve.core.hooks import call_async, call_blocking, model_code
from twinserve.core.occupancy import Occupancy
from twinserve.core.settings import class_settings, effective_settings, model_config
from twinserve.core.streams import AsyncSteps, GeneratorSteps, Steps
from twinserve.core.threads import limit_threads
from twinserve.errors import DeadlineExceeded, QueueFull, TwinserveError
from twinserve.model import Hook, ModelSpec, import_model
from twinserve.observability.context import RequestContext, current_request
from twinserve.observability.metrics import metrics
from twinserve.observability.sums import Writes, metric_sums
from twinserve.observability.tracing import BatchTrace, RequestTrace

__all__ = ["ModelRuntime", "load_runtimes"]

logger = logging.getLogger("twinserve.runtime")


class ModelRuntime:
    """A model plus its executor and batcher, callable from either front; it takes and returns instances (the
    protocols' codecs are the fronts': `twinserve.protocol.codecs`)."""

    def __init__(
        self,
        target: str,
        config: Config,
        settings: Mapping[str, Any] | None = None,
        module: str | None = None,
        *,
        name: str | None = None,
        version: str | None = None,
    ) -> None:
        """`settings`: the model's settings file's (over its class's); `module`: the module name its file is
        imported under; `name` and `version`: what it is served as, over its class's (a model repository's)."""
        self.target = target
        #: The module name a model file is imported under (None: derived from the file's name).
        self.module = module
        started = time.perf_counter()
        model_class = import_model(target, module)
        # The class's own settings, then those of its settings file (`settings`) over them, then the server's.
        label = name or getattr(model_class, "name", None) or model_class.__name__.lower()
        #: This model's effective settings: the server's Config with its per-model keys over it (core/settings.py).
        self.config = config = model_config(config, {**class_settings(model_class), **(settings or {})}, label)
        with model_code(label, "__init__"):  # its own code: a failure names the model and keeps its text private
            self.model = model_class()
        with contextlib.suppress(AttributeError):  # __slots__ or read-only: the model just doesn't see it
            self.model.config = config
        #: `--device` resolved (once per process): a GPU asked for and not there fails here, at start-up.
        self.device = device_for(config.device)
        with contextlib.suppress(AttributeError):
            self.model.device = self.device
        #: The stream each thread that runs predict computes on (a pass-through on the CPU).
        self.placement = Placement(self.device)
        self.spec = ModelSpec(self.model)
        if name is not None:
            self.spec.name = name
        self.name = self.spec.name
        if version is not None:
            self.spec.version = version
        self.ready = False
        #: Its import and construction, part of its cold start (`twinserve_model_load_seconds`).
        self.import_seconds = time.perf_counter() - started
        #: Requests admitted to this model and not yet closed: an unload drains them first.
        self.occupancy = Occupancy()
        self.load_seconds: float | None = None
        self.max_batch_size = config.effective_max_batch_size
        self.executor_name = resolve_executor(config, self.spec)
        #: Predict re-runs a failed batch may take to isolate its failing requests (0: the whole batch fails).
        self.isolate_max_reruns = (
            config.isolate_max_reruns if config.isolate_failures and self.spec.isolate_failures else 0
        )
        self.executor: Executor | None = None
        registry = metrics()
        self._sums = metric_sums()
        self._metrics: dict[str, Any] = {
            "batch_size": registry.batch_size.labels(self.name),
            "inference": registry.inference_seconds.labels(self.name),
            "compute": registry.compute_seconds.labels(self.name),
            "queue_wait": registry.queue_wait.labels(self.name),
            "queued": registry.queued.labels(self.name),
            "load": registry.load_seconds.labels(self.name, self.spec.version),
            "isolations": registry.isolations.labels(self.name),
            "isolation_reruns": registry.isolation_reruns.labels(self.name),
            "isolation_answered": registry.isolation_requests.labels(self.name, "answered"),
            "isolation_failed": registry.isolation_requests.labels(self.name, "failed"),
            "cache_hit": registry.cache.labels(self.name, "hit"),
            "cache_miss": registry.cache.labels(self.name, "miss"),
        }
        self.cache: ResponseCache | None = None
        if config.cache_size > 0:
            self.cache = ResponseCache(f"{self.name}@{self.spec.version}", config.cache_size, config.cache_ttl_s)
        self._async_batcher: AsyncBatcher | None = None
        self._thread_batcher: ThreadBatcher | None = None
        # Blocking preprocess hooks called from the event loop run here; in debug mode they run inline.
        self._hooks_pool: ThreadPoolExecutor | None = None
        #: Sync, unbatched: where predict runs when a request has a deadline (started on first use).
        self._deadline_pool: ThreadPoolExecutor | None = None
        if config.arch != "sync" and not config.debug:
            self._hooks_pool = ThreadPoolExecutor(config.threads, thread_name_prefix=f"twinserve-{self.name}")

    @property
    def stats(self) -> BatchStats | None:
        batcher = self._async_batcher or self._thread_batcher
        return batcher.stats if batcher is not None else None

    def _new_queue(self, max_in_flight: int) -> BatchQueue[Any]:
        config = self.config
        delay = config.max_batch_delay_ms / 1000
        levels, wait = config.priority_levels, config.max_queue_wait_ms / 1000
        return BatchQueue(self.max_batch_size, delay, config.max_queue, max_in_flight, levels, wait)

    def _new_executor(self) -> Executor:
        handle = ModelHandle(self.target, self.spec, self.config, placement=self.placement, module=self.module)
        return EXECUTORS[self.executor_name](handle)

    @property
    def _loads_in_process(self) -> bool:
        # With model-worker processes the server process needs the model only to run `preprocess` itself.
        return self.executor_name != "process" or self.spec.preprocess is not None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def load(self) -> None:
        """Load for the sync front: in this process; a batcher only if batching is on."""
        start = time.perf_counter()
        if self.spec.load is not None and self._loads_in_process:
            with model_code(self.name, "load"):
                call_blocking(self.spec.load)
            self.placement.loaded()
        if self.max_batch_size > 1 or self.executor_name == "process":
            executor = self.executor = self._new_executor()
            executor.start()
            self._thread_batcher = ThreadBatcher(
                self._new_queue(executor.max_in_flight), executor.run, executor.max_in_flight, self.isolate_max_reruns
            )
            self._thread_batcher.stats.observer = self._observe_batch
            self._thread_batcher.stats.isolation_observer = self._observe_isolation
        else:
            self.executor_name = "request-thread"  # predict is called directly where the request runs (S3)
        self._loaded(start)

    async def aload(self) -> None:
        """Load for the async fronts: in this process (off the loop, on a daemon thread: a server told to stop does
        not wait for it) and in the executor; start the batcher."""
        start = time.perf_counter()
        if self.spec.load is not None and self._loads_in_process:
            offload = None if self._hooks_pool is None else run_in_daemon_thread  # debug: inline
            with model_code(self.name, "load"):
                await call_async(self.spec.load, offload=offload)
            self.placement.loaded()
        executor = self.executor = self._new_executor()
        await executor.astart()
        self._async_batcher = AsyncBatcher(
            self._new_queue(executor.max_in_flight), executor.arun, self.isolate_max_reruns
        )
        self._async_batcher.stats.observer = self._observe_batch
        self._async_batcher.stats.isolation_observer = self._observe_isolation
        self._async_batcher.start()
        self._loaded(start)

    def _observe_batch(self, size: int, waits: list[float], seconds: float, queued: int) -> None:
        m, writes = self._metrics, Writes()  # summed per interval, as each request's are (observability/sums.py)
        writes.observe(m["batch_size"], size)
        writes.observe(m["inference"], seconds)
        writes.inc(m["compute"], seconds * len(waits))
        writes.observe_all(m["queue_wait"], waits)
        self._sums.add(writes)
        m["queued"].set(queued)

    def _observe_isolation(self, requests: int, failed: int, reruns: int) -> None:
        m = self._metrics
        m["isolations"].inc()
        m["isolation_reruns"].inc(reruns)
        m["isolation_answered"].inc(requests - failed)
        m["isolation_failed"].inc(failed)

    def _loaded(self, start: float) -> None:
        threads = limit_threads(self.config, self.executor_name)  # its libraries are imported now: before any batch
        self.load_seconds = time.perf_counter() - start
        # Its cold start, one figure for the log and `twinserve_model_load_seconds`: the import and construction
        # plus the load, not any wait between them (a cold model of --max-loaded-models, built at start).
        cold_start = self.import_seconds + self.load_seconds
        self._metrics["load"].observe(cold_start)
        self.ready = True
        logger.info(
            "model %r version %s ready in %.3f s (import %.3f s, load %.3f s; executor %s, max batch %d, "
            "math threads per process %s)",
            self.name,
            self.spec.version,
            cold_start,
            self.import_seconds,
            self.load_seconds,
            self.executor_name,
            self.max_batch_size,
            threads or "as the environment's *_NUM_THREADS say",
        )

    def close(self) -> None:
        self.ready = False
        if self._thread_batcher is not None:
            self._thread_batcher.close()
        if self.executor is not None:
            self.executor.close()
        for pool in (self._hooks_pool, self._deadline_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        self.ready = False
        if self._async_batcher is not None:
            await self._async_batcher.close()
        self.close()

    # -- inference ---------------------------------------------------------------------------------------
    @property
    def crowded(self) -> bool:
        """Whether `refuse_early` may refuse any level now: a few reads, no lock, for the HTTP server to ask on
        every request before it looks closer (fronts/early.py)."""
        batcher = self._async_batcher or self._thread_batcher
        return batcher is not None and self.cache is None and batcher.queue.crowded

    def refuse_early(self, priority: int = 1) -> None:
        """QueueFull now, from the request's head, when the batch queue cannot take even one more instance at
        `priority`: such a rejection costs no body read and no decode. A model with a cache is never refused
        early, since the cache may answer the request whole. (The queue is read without its driver's lock: a
        stale read only moves the refusal to `BatchQueue.put`, which decides under it.)"""
        error = self.early_refusal(priority)
        if error is not None:
            raise error

    def early_refusal(self, priority: int = 1) -> QueueFull | None:
        """The QueueFull `refuse_early` raises, else None (the HTTP server's refusal, fronts/early.py)."""
        error = self._queue_refusal(priority)
        if error is not None:
            (self._async_batcher or self._thread_batcher).stats.rejected += 1  # type: ignore[union-attr]
        return error

    def _queue_refusal(self, priority: int) -> QueueFull | None:
        batcher = self._async_batcher or self._thread_batcher
        if batcher is None or self.cache is not None:
            return None
        queue = batcher.queue
        if not queue.crowded:  # every level may put one more: no refusal, no wait to estimate, no message
            return None
        queued = queue.queued_instances
        return queue.bound.refusal(
            queued, 1, f"the queue holds {queued} instances", priority, queue.expected_wait(1, priority)
        )

    def predict(self, instances: list[Any], deadline: float | None = None) -> list[Any]:
        """Blocking path (sync front): cached outputs, else preprocess and predict (directly or batched)."""
        if self.cache is None:
            return self._predict(instances, deadline)
        lookup = self._lookup(self.cache, instances)
        if not lookup.missing:
            return lookup.outputs()
        return self.cache.fill(lookup, self._predict(lookup.missing, deadline))

    async def apredict(
        self, instances: list[Any], deadline: float | None = None, gone: Callable[[], bool] | None = None
    ) -> list[Any]:
        """Coroutine path (async fronts): cached outputs, else preprocess (off the loop) and the batcher.

        `gone` tells whether the client has left; the batcher then drops the request before compute.
        """
        if self.cache is None:
            return await self._apredict(instances, deadline, gone)
        lookup = self._lookup(self.cache, instances)
        if not lookup.missing:
            return lookup.outputs()
        return self.cache.fill(lookup, await self._apredict(lookup.missing, deadline, gone))

    def _lookup(self, cache: ResponseCache, instances: list[Any]) -> Lookup:
        lookup = cache.lookup(instances)
        if lookup.found:
            self._metrics["cache_hit"].inc(len(lookup.found))
        if lookup.missing:
            self._metrics["cache_miss"].inc(len(lookup.missing))
        return lookup

    def _predict(self, instances: list[Any], deadline: float | None) -> list[Any]:
        _check_deadline(deadline)
        pre = self.spec.preprocess
        if pre is not None:
            trace = _current_trace()
            if trace is None:
                instances = self._preprocess(pre, instances)
            else:
                with trace.preprocess():
                    instances = self._preprocess(pre, instances)
        if self._thread_batcher is not None:
            return self._thread_batcher.submit(instances, deadline)
        context = current_request()
        started = time.monotonic()
        if context is None or context.trace is None:
            compute = functools.partial(self._predict_here, instances)
        else:
            compute = functools.partial(self._traced_here, context, instances)
        outputs = compute() if deadline is None else self._before(deadline, compute)
        # Called directly in the request thread: a batch of this request alone, which never queued.
        self._observe_batch(len(instances), [0.0], time.monotonic() - started, 0)
        if context is not None:
            context.batch_size, context.queue_wait_s = len(instances), 0.0
        return outputs

    def _traced_here(self, context: RequestContext, instances: list[Any]) -> list[Any]:
        with BatchTrace([context], [context.request_id], len(instances)):
            return self._predict_here(instances)

    def _before(self, deadline: float, compute: Callable[[], list[Any]]) -> list[Any]:
        """`compute()` on a deadline thread, its answer awaited until `deadline` at most: then 504, as in the async
        fronts. A computation already running cannot be stopped (Python threads cannot be interrupted): it
        finishes on its thread and its answer is dropped."""
        if self._deadline_pool is None:
            self._deadline_pool = ThreadPoolExecutor(self.config.threads, thread_name_prefix=f"twinserve-{self.name}")
        future = self._deadline_pool.submit(contextvars.copy_context().run, compute)
        try:
            return future.result(max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued behind an overrunning computation: never started
            raise deadline_passed() from None

    def _preprocess(self, pre: Hook, instances: list[Any]) -> list[Any]:
        with model_code(self.name, "preprocess"):
            return [call_blocking(pre, i) for i in instances]

    def _predict_here(self, instances: list[Any]) -> list[Any]:
        with self.placement.computing(), model_code(self.name, "predict"):
            return call_blocking(self.spec.predict, instances)  # type: ignore[no-any-return]

    async def _apredict(
        self, instances: list[Any], deadline: float | None, gone: Callable[[], bool] | None
    ) -> list[Any]:
        _check_deadline(deadline)
        pre = self.spec.apreprocess
        if pre is not None:
            trace = _current_trace()
            if trace is None:
                instances = await self._apreprocess(pre, instances)
            else:
                with trace.preprocess():
                    instances = await self._apreprocess(pre, instances)
        if self._async_batcher is None:
            raise TwinserveError(f"model {self.name!r} was not loaded for the event loop")
        return await self._async_batcher.submit(instances, deadline, gone)

    async def _apreprocess(self, pre: Hook, instances: list[Any]) -> list[Any]:
        with model_code(self.name, "preprocess"):
            if pre.is_async:
                if len(instances) == 1:  # the usual request: awaited here, without gather's task and future
                    return [await pre.fn(instances[0])]
                # Independent I/O per instance: overlap it.
                return list(await asyncio.gather(*(pre.fn(i) for i in instances)))
            processed: list[Any] = await self._offload(lambda: [pre.fn(i) for i in instances])
            return processed

    async def _offload(self, fn: Any, *args: Any) -> Any:
        if self._hooks_pool is None:
            return fn(*args)
        return await run_in_executor(self._hooks_pool, fn, *args)

    # -- streams -----------------------------------------------------------------------------------------
    def stream(self, instances: list[Any], deadline: float | None = None) -> Steps:
        """Blocking path (sync front): preprocess, then the generator, stepped by the caller (no cache, no batch)."""
        assert self.spec.stream is not None, "callers check spec.streams"
        _check_deadline(deadline)
        if self.spec.preprocess is not None:
            instances = self._preprocess(self.spec.preprocess, instances)
        if self.executor is not None:
            return self.executor.stream(instances, deadline)
        return GeneratorSteps(self.spec.stream, instances, self.name)

    async def astream(self, instances: list[Any], deadline: float | None = None) -> AsyncSteps:
        """Coroutine path (async fronts): preprocess (off the loop), then the generator where the executor runs
        predict, stepped by the caller."""
        _check_deadline(deadline)
        if self.spec.apreprocess is not None:
            instances = await self._apreprocess(self.spec.apreprocess, instances)
        if self.executor is None:
            raise TwinserveError(f"model {self.name!r} was not loaded for the event loop")
        return self.executor.astream(instances, deadline)

    # -- description -------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.spec.version, "ready": self.ready}

    def metadata(self) -> dict[str, Any]:
        serving: dict[str, Any] = {
            "max_batch_size": self.max_batch_size,
            "executor": self.executor_name,
            "settings": effective_settings(self.config),
        }
        if self.executor is not None:
            serving.update(self.executor.describe())
        if self.cache is not None:
            serving["cache"] = self.cache.describe()
        batcher = self._async_batcher or self._thread_batcher
        if batcher is not None:
            stats = batcher.stats
            serving["queued_instances"] = batcher.queue.queued_instances
            serving["in_flight_batches"] = batcher.queue.in_flight
            serving["batches"] = {
                "count": stats.batches,
                "instances": stats.instances,
                "rejected_queue_full": stats.rejected,
                "expired": stats.expired,
                "cancelled": stats.cancelled,
            }
            serving["failure_isolation"] = {
                "max_reruns": self.isolate_max_reruns,
                "batches": stats.isolated,
                "reruns": stats.isolation_reruns,
                "failed_requests": stats.isolation_failed,
            }
        return {
            **self.summary(),
            "streams": self.spec.streams,  # `:stream` answers with Server-Sent Events
            "examples": self.spec.examples(),
            "serving": serving,
        }


def _current_trace() -> RequestTrace | None:
    context = current_request()
    return None if context is None else context.trace


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and deadline <= time.monotonic():
        raise DeadlineExceeded("the request's deadline passed before it was computed")


def load_runtimes(config: Config) -> dict[str, ModelRuntime]:
    """Import and instantiate every configured model (not yet loaded), keyed by served name."""
    runtimes: dict[str, ModelRuntime] = {}
    for target in config.models:
        runtime = ModelRuntime(target, config)
        if runtime.name in runtimes:
            raise TwinserveError(f"two models are served under the name {runtime.name!r}")
        runtimes[runtime.name] = runtime
    return runtimes
