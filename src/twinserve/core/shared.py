"""State shared by every process of one server: a few float slots in a memory-mapped file, under one lock.

A server's worker processes are started by gunicorn (forked) and by uvicorn (spawned); neither hands them
anything but the environment. So the process that starts the server makes the file first (`create`) and names
it in `TWINSERVE_SHARED_STATE`; each worker maps it itself (`attach`). Two locks guard it: `flock` keeps other
processes out (each worker opens the file itself, so each has its own open file description), and a thread lock
keeps out this process's other threads, which `flock` on one shared description would let through.

Rate limits use it to be exact over the whole server (`core/admission.py`); a slot holds what a bucket needs.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Protocol

__all__ = ["SHARED_STATE_ENV", "LocalSlots", "SharedSlots", "Slots", "Values", "attach", "create", "private_file"]

SHARED_STATE_ENV = "TWINSERVE_SHARED_STATE"
_SLOT = 8  # one float64
_SHM = "/dev/shm"  # memory, not disk, where Linux has it


class Values(Protocol):
    """The slots, read and written by index while locked (a list, or a float64 view of the shared map)."""

    def __getitem__(self, index: int, /) -> float: ...
    def __setitem__(self, index: int, value: float, /) -> None: ...


class LocalSlots:
    """Slots in this process only (one worker, or no shared file): a list under a thread lock."""

    def __init__(self, count: int) -> None:
        self._values = [0.0] * count
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    @contextlib.contextmanager
    def locked(self) -> Iterator[Values]:
        with self._lock:
            yield self._values


class SharedSlots:
    """Slots every process of the server sees, in the file at `path` (made by `create`)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        self._map = mmap.mmap(self._fd, size)
        self._values = memoryview(self._map).cast("d")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    @contextlib.contextmanager
    def locked(self) -> Iterator[Values]:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield self._values
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)


Slots = LocalSlots | SharedSlots


def private_file(prefix: str, suffix: str = "") -> tuple[int, str]:
    """A new empty file for the server about to start, open for writing: only this account may open it (0600,
    made with O_EXCL), in a new folder only it may enter (0700), in memory where Linux has /dev/shm. Both are
    removed when this process exits, not when a forked worker does (it inherits the handler too).

    A file at a fixed or guessable path in the shared /dev/shm would let another local account make it first and
    take it over: the folder, made by `mkdtemp`, is what keeps it out, together with every file made
    in it later (`DesiredState`'s replacements and lock)."""
    base = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else None
    folder = tempfile.mkdtemp(prefix=prefix, dir=base)
    fd, path = tempfile.mkstemp(suffix=suffix, dir=folder)
    creator = os.getpid()
    atexit.register(lambda: shutil.rmtree(folder, ignore_errors=True) if os.getpid() == creator else None)
    return fd, path


def create(count: int) -> str:
    """Make a zeroed file of `count` slots for the server about to start (`private_file`) and name it in the
    environment its workers inherit. Returns its path."""
    fd, path = private_file("twinserve-state-")
    try:
        os.ftruncate(fd, count * _SLOT)
    finally:
        os.close(fd)
    os.environ[SHARED_STATE_ENV] = path
    return path


def attach(count: int) -> SharedSlots | None:
    """The server's shared slots, when the process that started it made them with room for `count`."""
    path = os.environ.get(SHARED_STATE_ENV)
    if not path or not os.path.exists(path):
        return None
    slots = SharedSlots(path)
    return slots if len(slots) >= count else None
