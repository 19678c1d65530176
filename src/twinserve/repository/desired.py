"""`--model-control explicit` over several server processes: every process follows the loads and unloads that any
one of them was asked for.

The process that took a change applies it, then publishes it in a small shared file: each model's desired state
(and traffic policy) with one generation counter for the server. The others `stat` the file a few times a second
and apply every change newer than their last through their own `ModelControl`, reading the folder again
themselves; a replacement worker applies the whole file once loaded. The starting process makes the file in a
private folder and names it in `TWINSERVE_REPOSITORY_STATE`, the environment being all its workers share.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinserve.core.shared import private_file
from twinserve.repository.control import ModelControl

__all__ = ["DESIRED_STATE_ENV", "DesiredState", "RepositoryFollower", "create"]

DESIRED_STATE_ENV = "TWINSERVE_REPOSITORY_STATE"
#: How often a process looks at the shared file (one `stat` each time).
FOLLOW_INTERVAL_S = 0.2
_SHM = "/dev/shm"

logger = logging.getLogger("twinserve.repository")


@dataclass(frozen=True)
class Change:
    """One model's desired state, as of server-wide generation `generation`: loaded or not, or (`traffic` set)
    its traffic policy as the repository API took it (repository/traffic.py)."""

    model: str
    loaded: bool
    generation: int
    traffic: dict[str, Any] | None = None


def create() -> str:
    """Make the empty shared file for the server about to start (`core/shared.py` `private_file`) and name it in
    the environment its workers get."""
    fd, path = private_file("twinserve-repository-", ".json")
    with os.fdopen(fd, "w") as file:
        json.dump({"generation": 0, "models": {}, "traffic": {}}, file)
    os.environ[DESIRED_STATE_ENV] = path
    return path


class DesiredState:
    """The shared file, seen from one process: what it published and applied, by model."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._applied: dict[str, int] = {}
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()

    @classmethod
    def attach(cls) -> DesiredState | None:
        """This server's shared file (None: one process, nothing to share)."""
        path = os.environ.get(DESIRED_STATE_ENV)
        return cls(Path(path)) if path else None

    def publish(self, model: str, loaded: bool) -> int:
        """Record that `model` is now loaded (or unloaded) here, for the other processes; its generation."""
        return self._publish("models", model, {"loaded": loaded})

    def publish_traffic(self, model: str, traffic: dict[str, Any]) -> int:
        """Record `model`'s traffic policy as set here, for the other processes; its generation."""
        return self._publish("traffic", model, {"policy": traffic})

    def _publish(self, section: str, model: str, entry: dict[str, Any]) -> int:
        with self._locked():
            state = self._read()
            generation = state["generation"] = int(state["generation"]) + 1
            state.setdefault(section, {})[model] = {**entry, "generation": generation}
            with self._lock:  # before the file says so: this process's own follower must not apply it again
                self._applied[_applied_key(section, model)] = generation
            # A new file each time (O_EXCL, 0600, in the server's own folder): no path another account could
            # make first. Readers see the old file or the new one, never half of one.
            fd, temporary = tempfile.mkstemp(suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as file:
                    file.write(json.dumps(state))
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        return generation

    def pending(self) -> list[Change]:
        """The changes published since this process last applied each model's, oldest first (none when the
        file's size and modification time are as last seen)."""
        try:
            stat = self.path.stat()
        except OSError:
            return []
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return []
        self._stamp = stamp
        try:
            state = self._read()
        except (OSError, ValueError):
            self._stamp = None  # look again next time
            return []
        with self._lock:
            changes = [
                Change(name, bool(entry.get("loaded")), int(entry["generation"]), entry.get("policy"))
                for section in ("models", "traffic")
                for name, entry in state.get(section, {}).items()
                if int(entry["generation"]) > self._applied.get(_applied_key(section, name), 0)
            ]
        return sorted(changes, key=lambda change: change.generation)

    def applied(self, change: Change) -> None:
        key = _applied_key("models" if change.traffic is None else "traffic", change.model)
        with self._lock:
            self._applied[key] = max(change.generation, self._applied.get(key, 0))

    def _read(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.path.read_text())
        return state

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _applied_key(section: str, model: str) -> str:
    # Model names hold no ':' (service/routes.py): a traffic change's key never meets a model's.
    return model if section == "models" else f"traffic:{model}"


class RepositoryFollower:
    """Apply, in this process, what the other processes published (see the module docstring)."""

    def __init__(self, control: ModelControl, desired: DesiredState) -> None:
        self.control = control
        self.desired = desired
        self._stop = threading.Event()

    # -- the sync front: a thread -------------------------------------------------------------------------
    def follow(self) -> None:
        for change in self.desired.pending():
            try:
                if change.traffic is not None:
                    self.control.set_traffic(change.model, change.traffic)
                elif change.loaded:
                    self.control.load(change.model)
                elif self.control.registry.knows(change.model):
                    self.control.unload(change.model)
            except Exception:  # one model's failure must not stop the others'
                logger.exception("model %r: following a change another server process made failed", change.model)
            self.desired.applied(change)

    def start(self) -> None:
        self.follow()  # a replacement worker catches up at once
        threading.Thread(target=self._run, name="twinserve-repository-follow", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(FOLLOW_INTERVAL_S):
            if self.control.registry.closed:
                return
            self.follow()

    def stop(self) -> None:
        self._stop.set()

    # -- the async fronts: a task -------------------------------------------------------------------------
    async def afollow(self) -> None:
        for change in await asyncio.to_thread(self.desired.pending):
            try:
                if change.traffic is not None:
                    self.control.set_traffic(change.model, change.traffic)
                elif change.loaded:
                    await self.control.aload(change.model)
                elif self.control.registry.knows(change.model):
                    await self.control.aunload(change.model)
            except Exception:
                logger.exception("model %r: following a change another server process made failed", change.model)
            self.desired.applied(change)

    async def abegin(self) -> None:
        """Catch up before the server takes requests, as `start` does (a replacement worker)."""
        await self.afollow()

    async def arun(self) -> None:
        """Follow until cancelled (at shutdown)."""
        while True:
            await self.afollow()
            await asyncio.sleep(FOLLOW_INTERVAL_S)
