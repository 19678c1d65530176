"""`--model-control poll` (Triton's meaning): the repository folder is watched, and a model whose folder changed is
loaded again, a new folder loaded, a removed one unloaded.

A change is seen from file metadata alone (path, size and mtime of every file, every `--repository-poll-s`); the
loads and unloads are `ModelControl`'s, so a changed model serves its old versions until the new ones are ready.
The folder is the source of truth, so each server process polls it and reaches the same state by itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from twinserve.repository.control import ModelControl

__all__ = ["RepositoryPoller"]

logger = logging.getLogger("twinserve.repository")

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(folder: Path) -> Fingerprint:
    """Every file under `folder`: its relative path, size and modification time (ns)."""
    entries = []
    for path in sorted(folder.rglob("*")):
        try:
            if path.is_file() and "__pycache__" not in path.parts:
                stat = path.stat()
                entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
        except OSError:
            continue  # removed while it was read: the next poll sees the folder as it is then
    return tuple(entries)


class RepositoryPoller:
    """Watch one repository folder and apply its changes through `control` (see the module docstring)."""

    def __init__(self, control: ModelControl, root: Path, interval: float) -> None:
        self.control = control
        self.root = root
        self.interval = interval
        self._seen: dict[str, Fingerprint] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _scan(self) -> dict[str, Fingerprint]:
        return {
            folder.name: fingerprint(folder)
            for folder in self.root.iterdir()
            if folder.is_dir() and not folder.name.startswith((".", "_"))
        }

    def changes(self) -> tuple[list[str], list[str]]:
        """The model folders changed or added since the last call, and those removed."""
        now = self._scan()
        changed = sorted(name for name, mark in now.items() if self._seen.get(name) != mark)
        removed = sorted(set(self._seen) - set(now))
        self._seen = now
        return changed, removed

    # -- the sync front: a thread -------------------------------------------------------------------------
    def poll(self) -> None:
        """Apply one round of changes (blocking)."""
        changed, removed = self.changes()
        for name in changed:
            self._apply(name, "load", functools.partial(self.control.load, name))
        for name in removed:
            if self.control.registry.knows(name):
                self._apply(name, "unload", functools.partial(self.control.unload, name))

    def begin(self) -> None:
        """Take the folder as it is now (the models just loaded from it) as the state to compare with."""
        self._seen = self._scan()

    def start(self) -> None:
        """Watch on a thread of its own (the sync front), from the folder as it is now."""
        self.begin()
        self._thread = threading.Thread(target=self._run, name="twinserve-repository-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.control.registry.closed:
                return
            try:
                self.poll()
            except Exception:  # a round that failed (the folder unreadable for a moment) must not end the watch
                logger.exception("watching the model repository %s: a round of polling failed", self.root)

    def stop(self) -> None:
        self._stop.set()

    # -- the async fronts: a task -------------------------------------------------------------------------
    async def apoll(self) -> None:
        """Apply one round of changes (on the loop; imports and loads go off it)."""
        changed, removed = await asyncio.to_thread(self.changes)
        for name in changed:
            await self._aapply(name, "load", self.control.aload(name))
        for name in removed:
            if self.control.registry.knows(name):
                await self._aapply(name, "unload", self.control.aunload(name))

    async def abegin(self) -> None:
        """`begin` off the loop; awaited before the server takes requests (a change made once it serves, however
        soon, must differ from this state: a baseline taken later by a task could already hold it, and miss it)."""
        await asyncio.to_thread(self.begin)

    async def arun(self) -> None:
        """Poll until cancelled (at shutdown), from the state `abegin` took."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.apoll()
            except Exception:  # as in `_run`: the task would end silently, and this process stop following
                logger.exception("watching the model repository %s: a round of polling failed", self.root)

    # -- both ---------------------------------------------------------------------------------------------
    def _apply(self, name: str, change: str, do: Callable[[], object]) -> None:
        logger.info("model %r changed in the repository: %s", name, change)
        try:
            do()
        except Exception:  # one model's failure must not stop the watch of the others
            logger.exception("model %r: %s after a repository change failed", name, change)

    async def _aapply(self, name: str, change: str, do: Awaitable[object]) -> None:
        logger.info("model %r changed in the repository: %s", name, change)
        try:
            await do
        except Exception:
            logger.exception("model %r: %s after a repository change failed", name, change)
