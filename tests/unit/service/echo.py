"""A real `Service` over one loaded Echo model, for the IO-free tests of the service (no socket, no app)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.serving import model_path
from twinserve.config import Config
from twinserve.core.runtime import ModelRuntime
from twinserve.service.contract import Service


@contextmanager
def echo_service(name: str, **settings: Any) -> Iterator[Service]:
    """The service of a sync server of the Echo model under `name`, with `settings` in its Config."""
    config = Config(arch="sync", models=[model_path("Echo")], **settings)
    runtime = ModelRuntime(model_path("Echo"), config, name=name)
    runtime.load()
    try:
        yield Service({name: runtime}, config)
    finally:
        runtime.close()
