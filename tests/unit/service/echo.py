"""A real `Service` over one loaded model (Echo, unless told another of tests/models.py), for the IO-free tests of
the service (no socket, no app)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.serving import model_path
from twinserve.config import Config
from twinserve.core.runtime import ModelRuntime
from twinserve.service.contract import Service


@contextmanager
def echo_service(name: str, model: str = "Echo", arch: str = "sync", **settings: Any) -> Iterator[Service]:
    """The service of an `arch` (sync) server of `model` (Echo) under `name`, with `settings` in its Config."""
    config = Config(arch=arch, models=[model_path(model)], **settings)
    runtime = ModelRuntime(model_path(model), config, name=name)
    runtime.load()
    try:
        yield Service({name: runtime}, config)
    finally:
        runtime.close()
