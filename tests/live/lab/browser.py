"""Headless Chromium (Debian's `chromium`), run to completion with nothing of it left behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest


def running_in_group(pgid: int) -> list[int]:
    """The processes of a process group that still run (a zombie has finished; init reaps it)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            state, _ppid, group = stat.read_text().rpartition(")")[2].split()[:3]
            if int(group) == pgid and state != "Z":
                pids.append(int(stat.parent.name))
    return pids


def kill_group(pgid: int, grace: float) -> list[int]:
    """Give a process group `grace` seconds to finish, then SIGKILL what still runs, by PID; return those PIDs."""
    deadline = time.monotonic() + grace
    while (left := running_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def chromium(tmp_path: Path, *args: str, timeout: float = 90) -> str:
    """Run headless Chromium to completion in its own process group, and leave no process of it behind."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed: run scripts/system-deps.sh")
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    command = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]
    command += [f"--user-data-dir={profile}", *args]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, grace=0)
            proc.communicate()
            pytest.fail(f"chromium did not finish within {timeout} s: {command}")
        finally:
            left = kill_group(proc.pid, grace=10)
    assert not left, f"chromium exited but left processes running (killed): {left}"
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err[-2000:]}"
    return out
