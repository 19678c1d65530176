"""Console logs (`--log-format console`, the default on a terminal) escape a client's control bytes, as nginx does
and as JSON lines do by their format (issue #44: a path `/v1/models/%1b%5b2J...` cleared the terminal)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
import structlog

from twinserve.observability.logging import LogFormat, configure_logging

CLEAR = "\x1b[2J\x1b[H"  # erase the screen, cursor home


@pytest.fixture
def restored() -> Iterator[None]:
    """The logging set-up as it was, after the test configured its own."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:], root.level = handlers, level


def _log(fmt: LogFormat, monkeypatch: pytest.MonkeyPatch) -> str:
    """What two events write in format `fmt`. stderr is replaced in the test's body: pytest's own capture puts its
    stream back between a fixture's set-up and the test."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging("info", fmt)
    structlog.get_logger().info("request", path=f"/v1/models/{CLEAR}x:predict", status=401)
    logging.getLogger("twinserve.test").warning("model %r\nsecond line\x07", f"{CLEAR}forged\r\n")
    return stream.getvalue()


def test_values_and_messages_are_escaped_on_the_console(restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    err = _log("console", monkeypatch)
    assert CLEAR not in err and "\x07" not in err and "\r" not in err
    assert "/v1/models/\\x1b[2J\\x1b[Hx:predict" in err
    assert "second line\\x07" in err  # the message keeps its line break, and loses its bell


def test_json_lines_escape_by_their_format(restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    err = _log("json", monkeypatch)
    assert CLEAR not in err and "\\u001b[2J" in err and len(err.splitlines()) == 2
