"""CPU seconds of a process tree, for the scripts that price a request in CPU (psutil only: the scripts that run
inside an older checkout's interpreter import it too)."""

from __future__ import annotations

import os

import psutil

__all__ = ["tree_cpu_seconds"]


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
