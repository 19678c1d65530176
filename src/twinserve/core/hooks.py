"""Calling a model's hooks from blocking or coroutine code, with the model's own failures made into 500s."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from twinserve.core.bridge import run_coroutine
from twinserve.errors import ModelFailed, TwinserveError
from twinserve.model import Hook

__all__ = ["LOG_HINT", "call_async", "call_blocking", "model_code"]

logger = logging.getLogger("twinserve.runtime")

#: What a client reads in place of a model's exception text (which goes to the log alone).
LOG_HINT = "; the server log has the details"


@contextmanager
def model_code(model: str, stage: str) -> Iterator[None]:
    """Turn anything the model's own code raises into a ModelFailed (500), keeping deliberate errors.

    The exception's text goes to the log (with the ids of the requests being served) and into the error's
    private part, never into the message a client reads: it may hold a secret, or another client's input."""
    try:
        yield
    except TwinserveError:
        raise
    except Exception as exc:
        logger.exception("model %r raised in %s", model, stage)
        raise ModelFailed(
            f"model {model!r} raised in {stage}{LOG_HINT}", private=f"{type(exc).__name__}: {exc}"
        ) from exc


def call_blocking(hook: Hook, *args: Any) -> Any:
    """Call `hook` from a thread; a coroutine hook runs on this thread's own event loop."""
    if hook.is_async:
        return run_coroutine(hook.fn(*args))
    return hook.fn(*args)


async def call_async(hook: Hook, *args: Any, offload: Callable[..., Any] | None) -> Any:
    """Await `hook` from the event loop; a blocking hook goes through `offload` (inline when None)."""
    if hook.is_async:
        return await hook.fn(*args)
    if offload is None:
        return hook.fn(*args)
    return await offload(hook.fn, *args)
