"""Which models are loaded in this server process, and requests that wait for the one they ask for.

A request for a LOADING model waits for READY up to its deadline (then 504), or gets 503 `model_unavailable` when
the load fails; the async fronts wait on an `asyncio.Event`, so the loop keeps serving. With
`--max-loaded-models N` only N models are loaded at once: a request for a `cold` or `evicted` model loads it off
its own path, unloading the least recently used idle one first. An explicit load is the operator's and is not
refused; a model unloaded explicitly stays unloaded until an explicit load. Each process keeps its own recency.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Literal

from twinserve.config import Config
from twinserve.errors import DeadlineExceeded
from twinserve.observability.metrics import metrics
from twinserve.repository.control import ModelControl, forget_module
from twinserve.repository.registry import ModelRegistry, ServedVersion, failure_reason, failure_text

__all__ = ["COLD", "EVICTED", "Residency"]

logger = logging.getLogger("twinserve.repository")

#: The reason of a model left unloaded at start by `--max-loaded-models`: it loads on its first request.
COLD = "cold"
#: The reason of a model unloaded to make room for another: it loads again on its next request.
EVICTED = "evicted"
_ON_DEMAND = frozenset({COLD, EVICTED})
#: How often a waiting request looks at its model again, for changes no notification announces.
_LOOK_S = 0.05

Step = Literal["go", "wait", "load"]
#: The request's deadline (monotonic; None: none) given the model's own `timeout_ms` (None: the server's).
DeadlineOf = Callable[[int | None], float | None]


class Residency:
    """Which models of one registry are loaded, loads on demand and LRU eviction (see the module docstring)."""

    def __init__(self, registry: ModelRegistry, control: ModelControl | None, config: Config) -> None:
        self.registry = registry
        self.config = config
        #: Loads and unloads (None: MODEL arguments; then requests only wait for the server's start).
        self.control = control
        #: Most models loaded at once (None: no bound, nothing loads on demand).
        self.limit = config.max_loaded_models if control is not None else None
        self._uses = itertools.count(1)
        #: Model name -> when it was last asked for (a count, not a clock: only the order matters).
        self._used: dict[str, int] = {}
        #: Requests waiting for each model (a model with waiters is evicted last).
        self._waiting: Counter[str] = Counter()
        #: Models a load on demand is running for.
        self._loading: set[str] = set()
        #: The `timeout_ms` of models without a runtime now (cold or evicted), for their requests' deadlines.
        self._timeouts: dict[str, int | None] = {}
        self._changed = threading.Condition()
        self._load_lock = threading.Lock()  # the sync front: one load on demand at a time
        self._aload_lock: asyncio.Lock | None = None  # the async fronts: made on the loop
        self._event: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        if self.limit is not None:
            self._leave_cold(self.limit)

    def _leave_cold(self, limit: int) -> None:
        """Keep the first `limit` models (by name) of those about to load; the others stay cold until asked for."""
        names = sorted({e.name for e in self.registry.entries() if e.state == "LOADING" and e.runtime is not None})
        for name in names[limit:]:
            versions = self.registry.versions_of(name)
            cold = {
                e.version: e if e.runtime is None else ServedVersion(name, e.version, "UNAVAILABLE", COLD)
                for e in versions
            }
            for entry in self.registry.install(name, cold):
                assert entry.runtime is not None
                self._timeouts[name] = entry.runtime.config.timeout_ms
                entry.runtime.close()  # imported, never loaded: nothing runs yet
                forget_module(entry)

    # -- where a request stands ------------------------------------------------------------------------------
    def _ready_now(self, name: str, version: str | None) -> bool:
        """The common case, cheaply: an unversioned request for a model whose default version is ready."""
        if version is not None:
            return False
        runtime = self.registry.runtimes.get(name)
        return runtime is not None and runtime.ready

    def _step(self, name: str, version: str | None) -> Step:
        """go: admit the request now (ready, or unknown or unavailable: the lookup answers 404 or 503); wait: a
        load is under way; load: start one."""
        chosen = [e for e in self.registry.versions_of(name) if version is None or e.version == version]
        if version is None and self._default_loading(name, chosen):
            return "wait"
        if not chosen or any(e.state == "READY" for e in chosen):
            return "go"
        if name in self._loading or any(e.state in ("LOADING", "UNLOADING") for e in chosen):
            return "wait"
        if self.limit is not None and any(e.reason in _ON_DEMAND for e in chosen):
            return "load"
        return "go"

    def _default_loading(self, name: str, versions: list[ServedVersion]) -> bool:
        """Whether `name`'s default version is loading: while the server starts, the highest version, which an
        unversioned request waits for rather than take a lower one that loaded sooner."""
        default = self.registry.runtimes.get(name)
        return default is not None and any(e.runtime is default and e.state == "LOADING" for e in versions)

    def _timeout_ms(self, name: str) -> int | None:
        for entry in self.registry.versions_of(name):
            if entry.runtime is not None:
                return entry.runtime.config.timeout_ms
        return self._timeouts.get(name)

    def _bound(self, name: str, deadline_of: DeadlineOf) -> tuple[float | None, float]:
        """The request's deadline, and how long it may wait: its deadline, else `--max-timeout-ms`."""
        deadline = deadline_of(self._timeout_ms(name))
        return deadline, deadline if deadline is not None else time.monotonic() + self.config.max_timeout_ms / 1000

    def _used_now(self, name: str) -> None:
        if self.limit is not None:
            self._used[name] = next(self._uses)

    def _claim(self, name: str) -> None:
        """Mark `name` as loading (its cold or evicted versions LOADING in the index) before its load starts."""
        self._loading.add(name)
        for entry in self.registry.versions_of(name):
            if entry.runtime is None and entry.reason in _ON_DEMAND:
                entry.state, entry.reason = "LOADING", ""

    def _settled(self, name: str, error: BaseException | None) -> None:
        """After a load on demand: a load that raised before its versions were built leaves them UNAVAILABLE."""
        self._loading.discard(name)
        if error is None:
            return
        logger.error("model %r did not load on demand: %s", name, failure_text(error))
        for entry in self.registry.versions_of(name):
            if entry.state == "LOADING" and entry.runtime is None:
                entry.state, entry.reason = "UNAVAILABLE", failure_reason("load")

    @staticmethod
    def _late(name: str) -> DeadlineExceeded:
        return DeadlineExceeded(f"the request's deadline passed while model {name!r} was loading")

    # -- the sync front ----------------------------------------------------------------------------------------
    def wait(self, name: str, version: str | None, deadline_of: DeadlineOf) -> float | None:
        """Return once `name` (`version`) can be admitted: at once when it is ready, after its load otherwise
        (started here when it is cold or evicted). The request's deadline when it waited, else None."""
        if self._ready_now(name, version) or self._step(name, version) == "go":
            self._used_now(name)
            return None
        deadline, bound = self._bound(name, deadline_of)
        with self._changed:
            self._waiting[name] += 1
            try:
                while (step := self._step(name, version)) != "go":
                    if step == "load":
                        self._claim(name)
                        threading.Thread(target=self._load, args=(name,), name=f"load-{name}", daemon=True).start()
                    remaining = bound - time.monotonic()
                    if remaining <= 0:
                        raise self._late(name)
                    self._changed.wait(min(remaining, _LOOK_S))
            finally:
                self._waiting[name] -= 1
        self._used_now(name)
        return deadline

    def _load(self, name: str) -> None:
        assert self.control is not None
        error: BaseException | None = None
        try:
            with self._load_lock:
                self._make_room(name)
                self.control.load(name)
        except BaseException as exc:
            error = exc
        finally:
            with self._changed:
                self._settled(name, error)
                self._changed.notify_all()

    def _make_room(self, name: str) -> None:
        while (victim := self._victim(name)) is not None:
            self._remember(victim)
            assert self.control is not None
            self.control.unload(victim, EVICTED)
            self._evicted(victim)

    # -- the async fronts --------------------------------------------------------------------------------------
    async def await_ready(self, name: str, version: str | None, deadline_of: DeadlineOf) -> float | None:
        """`wait` for the event loop."""
        if self._ready_now(name, version) or self._step(name, version) == "go":
            self._used_now(name)
            return None
        deadline, bound = self._bound(name, deadline_of)
        self._waiting[name] += 1
        try:
            while (step := self._step(name, version)) != "go":
                if step == "load":
                    self._claim(name)
                    task = asyncio.get_running_loop().create_task(self._aload(name))
                    self._tasks.add(task)  # held until done: the loop keeps only a weak reference
                    task.add_done_callback(self._tasks.discard)
                remaining = bound - time.monotonic()
                if remaining <= 0:
                    raise self._late(name)
                changed = self._changed_event()
                with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancellation
                    async with asyncio.timeout(min(remaining, _LOOK_S)):
                        await changed.wait()
        finally:
            self._waiting[name] -= 1
        self._used_now(name)
        return deadline

    async def _aload(self, name: str) -> None:
        assert self.control is not None
        error: BaseException | None = None
        try:
            async with self._async_lock():
                while (victim := self._victim(name)) is not None:
                    self._remember(victim)
                    await self.control.aunload(victim, EVICTED)
                    self._evicted(victim)
                await self.control.aload(name)
        except BaseException as exc:
            error = exc
            if isinstance(exc, asyncio.CancelledError):  # the server stops
                raise
        finally:
            self._settled(name, error)
            changed, self._event = self._changed_event(), None
            changed.set()

    def _changed_event(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def _async_lock(self) -> asyncio.Lock:
        if self._aload_lock is None:
            self._aload_lock = asyncio.Lock()
        return self._aload_lock

    # -- eviction ----------------------------------------------------------------------------------------------
    def _victim(self, name: str) -> str | None:
        """The model to unload before `name` loads (None while fewer than the limit are loaded): the least
        recently used, among those without requests inside or waiting when there are any."""
        assert self.limit is not None
        loaded = sorted({e.name for e in self.registry.entries() if e.state == "READY" and e.name != name})
        if len(loaded) < self.limit:
            return None
        return min(loaded, key=lambda n: (self._busy(n), self._used.get(n, 0)))

    def _busy(self, name: str) -> bool:
        inside = sum(e.runtime.occupancy.inside for e in self.registry.versions_of(name) if e.runtime is not None)
        return inside > 0 or self._waiting[name] > 0

    def _remember(self, name: str) -> None:
        self._timeouts[name] = self._timeout_ms(name)

    def _evicted(self, name: str) -> None:
        logger.info("model %r unloaded to make room (--max-loaded-models %s)", name, self.limit)
        metrics().evictions.labels(name).inc()
