"""The Config of the server this process runs, as uvicorn's spawned worker processes rebuild it."""

from __future__ import annotations

import functools
import os

from twinserve.config import Config
from twinserve.servers.http1 import Limits

__all__ = ["CONFIG_ENV", "limits_of", "served_config"]

#: uvicorn's worker processes are spawned, not forked: they rebuild the Config from this variable.
CONFIG_ENV = "TWINSERVE_SERVE_CONFIG_JSON"


@functools.cache
def served_config() -> Config:
    """The Config `servers/uvicorn.py` `run` handed down (read once per process; `cache_clear` reads it again)."""
    return Config.model_validate_json(os.environ[CONFIG_ENV])


def limits_of(config: Config) -> Limits:
    return Limits(config.max_request_line, config.max_header_count, config.max_header_bytes, config.max_body_bytes)
