"""A server that cannot start says why in one line (servers/startup.py): the line a failing worker process reports,
and the start-up report the starting process reads it from. The whole path, through `twinserve serve` in each
architecture, is in tests/live/test_cli.py."""

from __future__ import annotations

import os

import pytest

from twinserve.errors import ModelFailed, ModelImportError
from twinserve.servers.startup import REPORT_ENV, StartupFailed, StartupReport, describe, report_failure


def test_a_failure_reads_as_one_line_with_its_cause() -> None:
    # The client's message points at the log; the operator reading this line reads the log: the cause goes in it.
    failed = ModelFailed("model 'bad' raised in load; the server log has the details", private="OSError: no\nweights")
    assert describe(failed) == "model 'bad' raised in load: OSError: no weights"
    assert describe(ModelImportError("cannot import 'm.py': SyntaxError")) == "cannot import 'm.py': SyntaxError"
    assert describe(KeyError("x")) == "KeyError: 'x'"


def test_the_first_failure_reported_is_the_one_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPORT_ENV, "")  # restored after the test: StartupReport names its file here
    report = StartupReport()
    assert os.environ[REPORT_ENV] == report.path
    report.check()  # nothing reported: the server stopped for another reason (or did not stop)
    assert report_failure(ModelFailed("model 'a' raised in load", private="RuntimeError: first")) == (
        "model 'a' raised in load: RuntimeError: first"
    )
    report_failure(RuntimeError("second"))  # another worker, a moment later
    with pytest.raises(StartupFailed, match=r"^model 'a' raised in load: RuntimeError: first$") as raised:
        report.check()
    assert raised.value.exit_code == 3
    report.starter = -1  # a forked worker unwinding the starter's frames: not its to raise
    report.check()
