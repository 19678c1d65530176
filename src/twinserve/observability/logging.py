"""Process-wide logging set-up, done once in every server process (gunicorn worker, uvicorn worker)."""

from __future__ import annotations

import logging

__all__ = ["configure_logging"]

_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Send twinserve's own log records (model load, model exceptions) to stderr at `level`."""
    logger = logging.getLogger("twinserve")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False
