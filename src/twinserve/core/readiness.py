"""A server of several processes is ready as one: once each of them has loaded its models.

Every server process answers while its models load (live, not ready) and loads them on its own. With `--workers N`
the kernel, or gunicorn's one socket, hands a connection to any of them: a readiness probe one process answered 200
while another still loads would send requests there that wait for that load (and a client reading a model's status
would get 503 from one process after 200 from another). So each process, once its models have loaded, marks itself
(`ServerReadiness.mark`: an empty file named by its pid, in a folder only the server's account may enter, which the
starting process made with `create` and named in `TWINSERVE_READY_DIR`: gunicorn forks the workers and uvicorn
spawns them, and the environment is all they share), and each says ready once N live processes have marked
(`all_ready`), then for good: a worker started later to replace one that died says only its own readiness, as a
worker that had not loaded said nothing at all before (its connections waited in the kernel's backlog).
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
