"""A scrape that meets a process's metric file before its header is written reads again, instead of answering 500.

Seen in CI (2026-12-05): hybrid's replacement model worker created its file while /metrics read the folder;
prometheus-client raised `struct.error` on the two-byte file and the scrape was answered 500 `internal error:
error`. A fresh interpreter writes the file a whole process would (the reader is prometheus-client's own)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from twinserve.observability import metrics

WRITE = "from prometheus_client import Gauge; Gauge('twinserve_up', 'up', multiprocess_mode='liveall').set(1)"


def test_a_file_being_created_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", WRITE], env=env, check=True, timeout=60)
    (whole,) = tmp_path.glob("gauge_liveall_*.db")
    starting = tmp_path / "gauge_liveall_99999999.db"
    starting.write_bytes(whole.read_bytes()[:2])  # created, its header not yet written
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
    waits: list[float] = []

    def finish_writing(seconds: float) -> None:  # the moment the process needs to write its file
        waits.append(seconds)
        starting.write_bytes(whole.read_bytes())

    monkeypatch.setattr(metrics, "time", SimpleNamespace(sleep=finish_writing, monotonic=time.monotonic))
    text = metrics.render().decode()
    assert len(waits) == 1
    assert 'twinserve_up{pid="99999999"} 1.0' in text


def test_a_file_that_stays_broken_is_not_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gauge_liveall_99999999.db").write_bytes(b"\x10\x00")
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
    monkeypatch.setattr(metrics, "time", SimpleNamespace(sleep=lambda seconds: None, monotonic=time.monotonic))
    with pytest.raises(Exception, match="unpack"):
        metrics.render()
