"""Loading and unloading repository models while the server runs (`--model-control explicit`, Triton's meaning).

A load reads the model's folder again and loads the versions its policy serves beside the ones serving now; only
once they are ready do they take the requests, and the old ones are drained and closed (a version that fails is
UNAVAILABLE with its reason). An unload stops admission, drains (up to `--graceful-timeout`) and closes. Both run
off every other request's path; changes are serialised and identical waiting loads merge into one. In the sync
front a change holds its request's thread, so at most half of `--threads` may (then 503 `queue_full`), leaving
threads for predicts. Other server processes follow through repository/desired.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

from twinserve.core.heap import collect_all
from twinserve.core.memory import release_free_memory
from twinserve.errors import ModelNotFound, QueueFull
from twinserve.repository.registry import ModelRegistry, ServedVersion
from twinserve.repository.traffic import TrafficPolicy

__all__ = ["ModelControl", "forget_module"]

logger = logging.getLogger("twinserve.repository")


class ModelControl:
    """Load and unload over one `ModelRegistry` (see the module docstring)."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self._lock = threading.Lock()  # the sync front: one change at a time across request threads
        self._alock: asyncio.Lock | None = None  # the async fronts: made on the loop that first needs it
        self._timeout = registry.config.graceful_timeout
        #: Each model's load waiting for its turn, which later loads of it join (see the module docstring).
        self._waiting: dict[str, concurrent.futures.Future[list[dict[str, str]]]] = {}
        self._awaiting: dict[str, asyncio.Future[list[dict[str, str]]]] = {}
        self._waiting_lock = threading.Lock()
        #: The sync front's request threads a change may hold at once (the others stay for predicts).
        self._threads = threading.BoundedSemaphore(max(1, registry.config.threads // 2))

    # -- the sync front -----------------------------------------------------------------------------------
    def load(self, name: str) -> list[dict[str, str]]:
        """(Re)load `name` from the repository; its index entries after."""
        with self._holding_a_thread():
            with self._waiting_lock:
                waiting = self._waiting.get(name)
                joined = waiting is not None
                if waiting is None:
                    waiting = self._waiting[name] = concurrent.futures.Future()
            if joined:
                return waiting.result()  # the answer of the load it joined, or its exception
            try:
                with self._lock:
                    with self._waiting_lock:  # its turn: a load asked from now on reads the folder after this one
                        del self._waiting[name]
                    folder = self.registry.reread(name)
                    staged = self.registry.built(folder)
                    self.registry.load_entries(_loading(staged))
                    self._retire(self.registry.install(name, staged, folder.traffic))
                entries = self._entries(name)
            except BaseException as exc:
                with self._waiting_lock:
                    if self._waiting.get(name) is waiting:
                        del self._waiting[name]
                waiting.set_exception(exc)
                raise
            waiting.set_result(entries)
            return entries

    def unload(self, name: str, reason: str = "unloaded") -> list[dict[str, str]]:
        """Drain and close every version of `name`, left UNAVAILABLE with `reason`; its index entries after."""
        self._known(name)
        with self._holding_a_thread(), self._lock:
            self._retire(self.registry.install(name, _unloaded(self.registry, name, reason)))
        return self._entries(name)

    @contextlib.contextmanager
    def _holding_a_thread(self) -> Iterator[None]:
        if not self._threads.acquire(blocking=False):
            raise QueueFull(
                "the server is busy loading or unloading models: retry this change later",
                headers={"Retry-After": "1"},
            )
        try:
            yield
        finally:
            self._threads.release()

    def _retire(self, old: list[ServedVersion]) -> None:
        if old:
            self._close(old)
            _free(old)

    def _close(self, old: list[ServedVersion]) -> None:
        for entry in _stopping(old):
            assert entry.runtime is not None
            if not entry.runtime.occupancy.wait_empty(self._timeout):
                logger.warning("model %r version %s: requests still inside after the drain", entry.name, entry.version)
            entry.runtime.close()
            forget_module(entry)

    # -- the async fronts ---------------------------------------------------------------------------------
    async def aload(self, name: str) -> list[dict[str, str]]:
        waiting = self._awaiting.get(name)
        if waiting is not None:
            return await asyncio.shield(waiting)  # joined: its answer (one caller leaving cancels nothing)
        waiting = self._awaiting[name] = asyncio.get_running_loop().create_future()
        try:
            async with self._async_lock():
                del self._awaiting[name]  # its turn: a load asked from now on reads the folder after this one
                folder = await asyncio.to_thread(self.registry.reread, name)
                # Importing a model runs its module's code: on a thread, so the loop keeps serving.
                staged = await asyncio.to_thread(self.registry.built, folder)
                await self.registry.aload_entries(_loading(staged))
                await self._aretire(self.registry.install(name, staged, folder.traffic))
            entries = self._entries(name)
        except BaseException as exc:
            if self._awaiting.get(name) is waiting:
                del self._awaiting[name]
            if not waiting.done():
                if isinstance(exc, asyncio.CancelledError):  # its caller left: those who joined are not cancelled
                    exc = QueueFull("the load this one joined was cancelled: retry", headers={"Retry-After": "1"})
                waiting.set_exception(exc)
                waiting.exception()  # retrieved: no "never retrieved" warning when nobody joined
            raise
        waiting.set_result(entries)
        return entries

    async def aunload(self, name: str, reason: str = "unloaded") -> list[dict[str, str]]:
        self._known(name)
        async with self._async_lock():
            await self._aretire(self.registry.install(name, _unloaded(self.registry, name, reason)))
        return self._entries(name)

    async def _aretire(self, old: list[ServedVersion]) -> None:
        if old:
            await self._aclose(old)
            _free(old)

    async def _aclose(self, old: list[ServedVersion]) -> None:
        for entry in _stopping(old):
            assert entry.runtime is not None
            if not await entry.runtime.occupancy.await_empty(self._timeout):
                logger.warning("model %r version %s: requests still inside after the drain", entry.name, entry.version)
            await entry.runtime.aclose()
            forget_module(entry)

    def _async_lock(self) -> asyncio.Lock:
        if self._alock is None:
            self._alock = asyncio.Lock()
        return self._alock

    # -- both ---------------------------------------------------------------------------------------------
    def set_traffic(self, name: str, table: Any) -> dict[str, Any]:
        """Spread `name`'s unversioned requests by its policy with the parts the traffic `table` names changed
        (`TrafficPolicy.updated`: the others kept, a part set to null removed) from now on: a ValueError naming what
        is wrong with it; the whole policy as it reads after. Another process's whole policy, published with every
        part named, replaces this process's."""
        policy = self.registry.traffic.get(name, TrafficPolicy()).updated(table)
        # A swap of one dict entry: no request waits for it. An empty policy is none: the default takes all.
        self.registry.set_traffic(name, None if policy.empty else policy)
        return policy.describe()

    def _known(self, name: str) -> None:
        if not self.registry.knows(name):
            raise ModelNotFound(f"model {name!r} is not in the model repository")

    def _entries(self, name: str) -> list[dict[str, str]]:
        return [entry.describe() for entry in self.registry.versions_of(name)]


def _loading(staged: dict[str, ServedVersion]) -> list[ServedVersion]:
    return [entry for entry in staged.values() if entry.state == "LOADING" and entry.runtime is not None]


def _unloaded(registry: ModelRegistry, name: str, reason: str) -> dict[str, ServedVersion]:
    """`name`'s versions as they read once unloaded: UNAVAILABLE, `reason` ("unloaded", "evicted"), no runtime."""
    return {
        entry.version: ServedVersion(entry.name, entry.version, "UNAVAILABLE", reason)
        for entry in registry.versions_of(name)
    }


def _stopping(old: list[ServedVersion]) -> list[ServedVersion]:
    """Stop admission to each old version (requests inside finish), marked UNLOADING until it is closed."""
    for entry in old:
        assert entry.runtime is not None
        entry.runtime.occupancy.stop()
        entry.state = "UNLOADING"
    return old


def _free(retired: list[ServedVersion]) -> None:
    """Free what the closed versions held, now: their objects may hold reference cycles, frozen with the rest of
    the process at its start (core/heap.py), and glibc keeps freed memory unless asked."""
    retired.clear()  # the last reference to them here (each closing loop's variable went with its frame)
    collect_all()
    release_free_memory()


def forget_module(entry: ServedVersion) -> None:
    """Drop a closed version's module, so that its code and data can be freed (each load imports its own)."""
    if entry.runtime is not None and entry.runtime.module is not None:
        sys.modules.pop(entry.runtime.module, None)
