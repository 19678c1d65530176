"""One logging pipeline per process: structlog events and stdlib records (gunicorn, uvicorn, the model's own
loggers) rendered the same way, as JSON lines or, on a terminal, for people.

Every line carries the id of the request being served where it was logged (see `context`), so a model's
`logging.getLogger(__name__).info(...)` inside `predict` names its request in every architecture.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Literal

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from twinserve.observability.context import request_ids

__all__ = ["LogFormat", "configure_logging", "for_console", "request_logger"]

LogFormat = Literal["auto", "json", "console"]


# structlog's `add_log_level` spelling: the aliases a method name may have.
_LEVELS = {"warn": "warning", "exception": "error"}


class _Stamp:
    """Level, UTC time, pid and the request's id in one processor: every line (one per request by default) pays one
    call, not four. The time is `TimeStamper(fmt="iso", utc=True)`'s ISO 8601 with microseconds, always six digits,
    its date and clock rendered once a second."""

    __slots__ = ("_clock",)

    def __init__(self) -> None:
        self._clock = (-1, "")  # (a second, its date and clock): one attribute, read and replaced whole by threads

    def __call__(self, logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        event["level"] = _LEVELS.get(method, method)
        second, micros = divmod(time.time_ns() // 1000, 1_000_000)
        clock = self._clock
        if clock[0] != second:
            clock = self._clock = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        event["timestamp"] = f"{clock[1]}.{micros:06d}Z"
        event["pid"] = os.getpid()
        ids = request_ids()
        if ids and "request_id" not in event:
            if len(ids) == 1:
                event["request_id"] = ids[0]
            else:
                event["request_ids"] = list(ids)
        return event


#: Control characters as `\xNN`: a client's bytes (a request path, a model name) must not drive the terminal that
#: shows the log (ESC sequences that clear it or forge lines, as nginx escapes them). JSON lines escape them already.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
#: A message may span lines (a multi-line warning); its other control characters are escaped.
_CONTROLS_IN_MESSAGE = {c: text for c, text in _CONTROLS.items() if c not in (0x09, 0x0A)}


def _escape_controls(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """For the console: every string value with its control characters escaped (the message keeps tabs and line
    breaks; a value, such as a request's path, keeps none)."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = value.translate(_CONTROLS_IN_MESSAGE if key == "event" else _CONTROLS)
    return event


def _json(logger: WrappedLogger, method: str, event: EventDict) -> str:
    """`format_exc_info` then `JSONRenderer` in one call; orjson renders what it cannot encode with `str`."""
    if "exc_info" in event:
        event = structlog.processors.format_exc_info(logger, method, event)
    return orjson.dumps(event, default=str).decode()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the root handler this module installed, so configuring again replaces it instead of doubling it."""


def for_console(fmt: LogFormat) -> bool:
    """Whether logs in format `fmt` are rendered for a person (a terminal) rather than as JSON lines."""
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def configure_logging(level: str, fmt: LogFormat = "auto") -> None:
    """Route structlog and every stdlib logger through one renderer on stderr, at `level`."""
    console = for_console(fmt)
    shared: list[Processor] = [_Stamp()]
    render: list[Processor] = [_escape_controls, structlog.dev.ConsoleRenderer()] if console else [_json]
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*shared, *render],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = _Handler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in ("twinserve", "gunicorn.error", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def request_logger() -> Any:
    """The logger of the one-event-per-request access log."""
    return structlog.get_logger().bind(logger="twinserve.access")
