"""A model version's cold start (issue #43): its "ready" log line names the version and says the same figure that
`twinserve_model_load_seconds` observes, measured from the same start (before its import) to the same end (ready),
with the import and the load apart. The log used to say the load alone (0.016 s) while the metric counted the import
too (a model module importing a heavy library: ~1 s)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from twinserve.config import load_config
from twinserve.core.runtime import ModelRuntime

#: Its import sleeps, as importing torch or scikit-learn takes time; so does its load().
SLOW = """
import time

time.sleep(0.05)

import twinserve


class Slow(twinserve.Model):
    def load(self):
        time.sleep(0.01)

    def predict(self, batch):
        return batch
"""
READY = re.compile(
    r"model 'cold' version 3 ready in (?P<total>[0-9.]+) s \(import (?P<imported>[0-9.]+) s, "
    r"load (?P<loaded>[0-9.]+) s; executor request-thread, max batch 1, .*\)"
)


def test_the_ready_line_says_what_the_metric_observes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    target, config = f"{tmp_path / 'slow.py'}:Slow", load_config(arch="sync")
    with caplog.at_level(logging.INFO, logger="twinserve.runtime"):
        runtime = ModelRuntime(target, config, module="cold_start_slow", name="cold", version="3")
        runtime.load()
    runtime.close()
    (line,) = [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]
    ready = READY.fullmatch(line)
    assert ready is not None, line
    observed = REGISTRY.get_sample_value("twinserve_model_load_seconds_sum", {"model": "cold", "version": "3"})
    assert observed is not None and f"{observed:.3f}" == ready["total"]  # one figure, one start, one end
    total, imported, loaded = (float(ready[k]) for k in ("total", "imported", "loaded"))
    assert abs(total - (imported + loaded)) <= 0.0015  # each rounded to a millisecond
    assert imported >= 0.05 and loaded >= 0.01  # the import counts (it slept that long at least)
