"""A server of several processes is ready once each has loaded (core/readiness.py): the marks, counted over live
processes only, and ready for good once all were."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from twinserve.core.readiness import READY_DIR_ENV, ServerReadiness


def test_ready_once_every_live_process_has_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(READY_DIR_ENV, str(tmp_path))
    assert ServerReadiness.attach(1) is None  # one process is the server: its own readiness says it all
    readiness = ServerReadiness.attach(2)
    assert readiness is not None
    readiness.mark()
    assert (tmp_path / str(os.getpid())).exists()
    assert not readiness.all_ready()
    (tmp_path / str(_exited_pid())).touch()  # a process that has exited: its mark does not count
    (tmp_path / "tmpabc123").touch()  # the starting process's own file: no process's mark
    assert not readiness.all_ready()
    (tmp_path / str(os.getppid())).touch()  # another live process of the server
    assert readiness.all_ready()
    for mark in tmp_path.iterdir():
        mark.unlink()
    assert readiness.all_ready()  # for good: a replacement worker later says only its own readiness


def _exited_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_without_the_folder_nothing_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(READY_DIR_ENV, raising=False)
    assert ServerReadiness.attach(4) is None
