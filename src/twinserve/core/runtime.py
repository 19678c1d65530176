"""One model in one process: load it once, then preprocess and predict, from blocking or coroutine callers.

`ModelRuntime` knows nothing of HTTP. The sync front calls `predict`, the async front awaits `apredict`;
both run the same hooks, validate the same way and raise the same errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from twinserve.config import Config
from twinserve.core.bridge import run_coroutine, run_in_executor
from twinserve.errors import ModelFailed, TwinserveError
from twinserve.model import Hook, ModelSpec, import_model
from twinserve.protocol.v1 import V1Codec

__all__ = ["ModelRuntime", "load_runtimes"]

logger = logging.getLogger("twinserve.runtime")


@contextmanager
def _model_code(model: str, stage: str) -> Iterator[None]:
    """Turn anything the model's own code raises into a ModelFailed (500), keeping deliberate errors."""
    try:
        yield
    except TwinserveError:
        raise
    except Exception as exc:
        logger.exception("model %r raised in %s", model, stage)
        raise ModelFailed(f"model {model!r} raised in {stage}: {type(exc).__name__}: {exc}") from exc


class ModelRuntime:
    """A loaded model plus its codec, callable from either front."""

    def __init__(self, model_cls: type, config: Config) -> None:
        self.config = config
        self.model = model_cls()
        with contextlib.suppress(AttributeError):  # __slots__ or read-only: the model just doesn't see it
            self.model.config = config
        self.spec = ModelSpec(self.model)
        self.name = self.spec.name
        self.codec = V1Codec(self.name, self.spec.input_type, self.spec.output_type)
        self.ready = False
        self.load_seconds: float | None = None
        # Blocking hooks called from the event loop run here; in debug mode they run inline so pdb works.
        self._executor: ThreadPoolExecutor | None = None
        if config.arch == "async" and not config.debug:
            self._executor = ThreadPoolExecutor(config.threads, thread_name_prefix=f"twinserve-{self.name}")

    # -- lifecycle ---------------------------------------------------------------------------------------
    def load(self) -> None:
        start = time.perf_counter()
        if self.spec.load is not None:
            with _model_code(self.name, "load"):
                self._call(self.spec.load)
        self._loaded(start)

    async def aload(self) -> None:
        start = time.perf_counter()
        if self.spec.load is not None:
            with _model_code(self.name, "load"):
                await self._acall(self.spec.load)
        self._loaded(start)

    def _loaded(self, start: float) -> None:
        self.load_seconds = time.perf_counter() - start
        self.ready = True
        logger.info("model %r loaded in %.3f s", self.name, self.load_seconds)

    def close(self) -> None:
        self.ready = False
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # -- inference ---------------------------------------------------------------------------------------
    def predict(self, instances: list[Any]) -> list[Any]:
        """Blocking path: preprocess each instance, then one `predict` call for the whole batch."""
        with _model_code(self.name, "preprocess"):
            pre = self.spec.preprocess
            if pre is not None:
                instances = [self._call(pre, i) for i in instances]
        with _model_code(self.name, "predict"):
            return self._call(self.spec.predict, instances)  # type: ignore[no-any-return]

    async def apredict(self, instances: list[Any]) -> list[Any]:
        """Coroutine path: same hooks; blocking ones run off the event loop."""
        with _model_code(self.name, "preprocess"):
            pre = self.spec.apreprocess
            if pre is not None:
                instances = await self._apreprocess(pre, instances)
        with _model_code(self.name, "predict"):
            return await self._acall(self.spec.apredict, instances)  # type: ignore[no-any-return]

    async def _apreprocess(self, pre: Hook, instances: list[Any]) -> list[Any]:
        if pre.is_async:
            # Independent I/O per instance: overlap it.
            return list(await asyncio.gather(*(pre.fn(i) for i in instances)))
        processed: list[Any] = await self._offload(lambda: [pre.fn(i) for i in instances])
        return processed

    def _call(self, hook: Hook, *args: Any) -> Any:
        if hook.is_async:
            return run_coroutine(hook.fn(*args))
        return hook.fn(*args)

    async def _acall(self, hook: Hook, *args: Any) -> Any:
        if hook.is_async:
            return await hook.fn(*args)
        return await self._offload(hook.fn, *args)

    async def _offload(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            return fn(*args)
        return await run_in_executor(self._executor, fn, *args)

    # -- description -------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.spec.version, "ready": self.ready}

    def metadata(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "input_schema": self.codec.input_schema(),
            "output_schema": self.codec.output_schema(),
            "examples": self.spec.examples(),
        }


def load_runtimes(config: Config) -> dict[str, ModelRuntime]:
    """Import and instantiate every configured model (not yet loaded), keyed by served name."""
    runtimes: dict[str, ModelRuntime] = {}
    for target in config.models:
        runtime = ModelRuntime(import_model(target), config)
        if runtime.name in runtimes:
            raise TwinserveError(f"two models are served under the name {runtime.name!r}")
        runtimes[runtime.name] = runtime
    return runtimes
