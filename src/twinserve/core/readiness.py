"""A server of several processes is ready as one: once each of them has loaded its models.

With `--workers N` any process may get a connection, so a readiness probe answered 200 by one process while
another still loads would send requests to wait for that load. Each process, once loaded, marks itself (an empty
file named by its pid, in a private folder the starting process made and named in `TWINSERVE_READY_DIR`, since
the environment is all that forked and spawned workers share), and says ready once N live processes have marked;
from then on for good, so a replacement worker says only its own readiness.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from twinserve.core.shared import private_file

__all__ = ["READY_DIR_ENV", "ServerReadiness", "create"]

READY_DIR_ENV = "TWINSERVE_READY_DIR"


def create() -> str:
    """Make the folder the server about to start marks its ready processes in (`private_file`'s, removed when this
    process exits) and name it in the environment its processes inherit. Returns its path."""
    fd, path = private_file("twinserve-ready-")
    os.close(fd)  # the file itself is no process's mark: its name is not a pid
    folder = os.path.dirname(path)
    os.environ[READY_DIR_ENV] = folder
    return folder


class ServerReadiness:
    """This process's view of whether the server's `processes` processes have all loaded (see the module)."""

    def __init__(self, folder: str, processes: int) -> None:
        self.folder = Path(folder)
        self.processes = processes
        self._all = False

    @classmethod
    def attach(cls, processes: int) -> ServerReadiness | None:
        """The server's, when it runs several processes and the starting process made the folder; else None (one
        process is ready as the server)."""
        folder = os.environ.get(READY_DIR_ENV)
        if processes <= 1 or not folder or not os.path.isdir(folder):
            return None
        return cls(folder, processes)

    def mark(self) -> None:
        """This process has loaded its models."""
        with contextlib.suppress(OSError):  # the folder is gone: the server stops
            (self.folder / str(os.getpid())).touch()

    def all_ready(self) -> bool:
        """Whether `processes` live processes have marked themselves, now or before."""
        if not self._all:
            self._all = self._marked() >= self.processes
        return self._all

    def _marked(self) -> int:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        return sum(1 for name in names if name.isdigit() and _alive(int(name)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone (a PermissionError: another account's took its pid)
        return False
    return True
