"""CPU seconds of a process tree, for the scripts that price a request in CPU (psutil only: the scripts that run
inside an older checkout's interpreter import it too)."""

from __future__ import annotations

import os
import time

import psutil

__all__ = ["settle", "tree_cpu_seconds"]


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (default: this one) and its live children (model workers,
    server workers); a child that exits between the listing and the reading is skipped."""
    root = psutil.Process(pid if pid is not None else os.getpid())
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def settle(pid: int, quiet: float = 0.1, interval_s: float = 0.25, limit_s: float = 30.0) -> float:
    """Wait until process tree `pid` uses under `quiet` of a core over `interval_s` (at most `limit_s`); the
    seconds waited. A scenario's requests still in a server's sockets when its clients stop (a flood's) are worked
    through after it, and would be in the next scenario's time."""
    started = time.monotonic()
    cpu = tree_cpu_seconds(pid)
    while time.monotonic() - started < limit_s:
        time.sleep(interval_s)
        now = tree_cpu_seconds(pid)
        if now - cpu < quiet * interval_s:
            break
        cpu = now
    return time.monotonic() - started
