"""The async front's lifespan: the models load at startup, what serves beside HTTP starts once they have, and
everything stops at shutdown.

Without an `on_load_failure` the startup completes once the models have loaded; with one it completes at once and
the models load in a task on the loop while the server answers, live and not ready (`ModelRegistry.starting`). The
repository's poll and the gRPC server (`--grpc-port`) start once the models have loaded, and stop at shutdown after
HTTP has drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from twinserve.core.runtime import ModelRuntime
from twinserve.observability.metrics import mark_process_dead
from twinserve.service.contract import Service

if TYPE_CHECKING:  # imported only with --grpc-port: its stubs fill protobuf's global pool
    from grpc import aio

    from twinserve.fronts.grpc import InferenceServicer

__all__ = ["AsgiLifespan"]


class AsgiLifespan:
    """ASGI's lifespan protocol for the app `create_asgi_app` builds (fronts/asgi.py), over `service`."""

    def __init__(
        self,
        service: Service,
        on_ready: Callable[[], None] | None = None,
        on_startup_failure: Callable[[BaseException], str] | None = None,
        on_load_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.service = service
        self._on_ready = on_ready
        self._on_startup_failure = on_startup_failure
        self._on_load_failure = on_load_failure
        #: What starts with the models and stops at shutdown: the repository's poll and the gRPC server.
        self._polling: asyncio.Task[None] | None = None
        self._grpc: tuple[aio.Server, InferenceServicer] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI's lifespan protocol; a failure is reported (the server logs the message and exits): at startup in the
        one line `on_startup_failure` makes of it, if given, else with its traceback."""
        service = self.service
        started = False
        await receive()  # lifespan.startup
        try:
            loading = None
            if self._on_load_failure is None:
                await self._load()
            else:  # the server answers while they load (see the module docstring)
                service.registry.starting = True
                loading = asyncio.create_task(self._load_behind(self._on_load_failure))
            await send({"type": "lifespan.startup.complete"})
            started = True
            await receive()  # lifespan.shutdown
            if loading is not None:  # told to stop while a model loads: the load stops at its next await
                loading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loading
            if self._grpc is not None:  # HTTP has drained by now; gRPC calls in flight get the same grace
                from twinserve.fronts.grpc import stop_grpc_server

                await stop_grpc_server(*self._grpc, service.config.graceful_timeout)
            if self._polling is not None:
                self._polling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._polling
            await service.registry.aclose()
            mark_process_dead(os.getpid())  # this worker's live gauges leave the aggregate with it
            if service.tracer is not None:
                service.tracer.shutdown()
        except BaseException as exc:
            if not started and self._on_startup_failure is not None and isinstance(exc, Exception):
                await send({"type": "lifespan.startup.failed", "message": self._on_startup_failure(exc)})
                raise
            failed = "lifespan.shutdown.failed" if started else "lifespan.startup.failed"
            await send({"type": failed, "message": traceback.format_exc()})
            raise
        await send({"type": "lifespan.shutdown.complete"})

    async def _load(self) -> None:
        """Load the models, then start what serves beside HTTP once they are loaded."""
        service = self.service
        await service.registry.aload()
        # The repository's poll, or the other server processes' explicit changes (repository/desired.py).
        if service.watch is not None:
            await service.watch.abegin()  # before the first request: a change from then on is seen
            self._polling = asyncio.create_task(service.watch.arun())
        if service.config.grpc_port is not None:  # imported only then: its stubs fill protobuf's global pool
            from twinserve.fronts.grpc import start_grpc_server

            self._grpc = await start_grpc_server(service, service.config, _apredict)
        if self._on_ready is not None:
            self._on_ready()

    async def _load_behind(self, on_load_failure: Callable[[BaseException], None]) -> None:
        """`_load` while the server answers; ready once it is done."""
        try:
            await self._load()
        except Exception as exc:
            on_load_failure(exc)
            return
        self.service.started()


async def _apredict(runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> list[Any]:
    """gRPC's predict on the event loop: into the same batcher as HTTP's (a cancelled call leaves its queue)."""
    return await runtime.apredict(instances, deadline)
