"""One logging pipeline per process: structlog events and stdlib records (gunicorn, uvicorn, the model's own
loggers) rendered the same way, as JSON lines or, on a terminal, for people.

Every line carries the id of the request being served where it was logged (see `context`), so a model's
`logging.getLogger(__name__).info(...)` inside `predict` names its request in every architecture.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Literal

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from twinserve.observability.context import request_ids

__all__ = ["configure_logging", "for_console", "request_logger"]

LogFormat = Literal["auto", "json", "console"]


def _add_request_ids(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    ids = request_ids()
    if ids and "request_id" not in event:
        if len(ids) == 1:
            event["request_id"] = ids[0]
        else:
            event["request_ids"] = list(ids)
    return event


def _add_pid(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    event["pid"] = os.getpid()
    return event


def _json(event: EventDict, **kwargs: Any) -> str:
    return orjson.dumps(event, default=str).decode()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the root handler this module installed, so configuring again replaces it instead of doubling it."""


def for_console(fmt: LogFormat) -> bool:
    """Whether logs in format `fmt` are rendered for a person (a terminal) rather than as JSON lines."""
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def configure_logging(level: str, fmt: LogFormat = "auto") -> None:
    """Route structlog and every stdlib logger through one renderer on stderr, at `level`."""
    console = for_console(fmt)
    shared: list[Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_pid,
        _add_request_ids,
    ]
    render: list[Processor] = (
        [structlog.dev.ConsoleRenderer()]
        if console
        else [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(serializer=_json)]
    )
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
