"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService` on `--grpc-port`, in every architecture.

Every RPC is one exchange (service/exchange.py), as an HTTP request is: opened with the request id from the
`x-request-id` metadata, authenticated from the `authorization` / `x-api-key` metadata when the path it stands for
needs a key, admitted from the message head (model, version, rate limit, size, readiness, priority, deadline),
decoded and encoded by the same V2 codec, with no JSON between (protocol/oip/messages.py), answered or failed,
logged and counted under the same endpoint names (`infer`, `live`, ...) and closed once. The gRPC deadline becomes
the request's deadline (capped by `--max-timeout-ms`, like `X-Request-Timeout-Ms`); a client that cancels leaves
the batch queue (499).

A failure is answered with the gRPC status for its HTTP status (`GRPC_CODES`) and the error message as details;
the request id comes back in the trailing metadata (`x-request-id`) of every call.

The server is `grpc.aio`, on the event loop of the process that serves HTTP: the async and hybrid fronts start it
in their lifespan, so that its calls meet HTTP's in the same batcher; the sync architecture runs one per gunicorn
worker on a thread of its own, whose predict calls wait on worker threads (`GrpcThread`). Several worker
processes share the port through SO_REUSEPORT (grpcio's default), as they share the HTTP socket.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import orjson
from grpc import aio

from twinserve.config import Config
from twinserve.core.admission import PRIORITY_HEADER, TIMEOUT_HEADER
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import ShuttingDown, TwinserveError
from twinserve.fronts.grpc_malformed import RefuseMalformed
from twinserve.protocol.oip import grpc_service_pb2 as pb
from twinserve.protocol.oip import grpc_service_pb2_grpc as pb_grpc
from twinserve.protocol.oip.messages import (
    config_message,
    infer_message,
    metadata_message,
    response_message,
    statistics_message,
)
from twinserve.service import drive
from twinserve.service.admission import RequestHead
from twinserve.service.contract import Service
from twinserve.service.exchange import Exchange

__all__ = [
    "GRPC_CODES",
    "GrpcThread",
    "InferenceServicer",
    "Predict",
    "Stream",
    "astream",
    "grpc_code",
    "start_grpc_server",
    "stop_grpc_server",
    "stream_on_threads",
]

logger = logging.getLogger("twinserve.grpc")

M = TypeVar("M")
#: How a front's predict waits: (runtime, instances, deadline) -> outputs.
Predict = Callable[[ModelRuntime, list[Any], float | None], Awaitable[list[Any]]]
#: How a front steps a streaming model: (runtime, instances, deadline) -> its steps.
Stream = Callable[[ModelRuntime, list[Any], float | None], AsyncGenerator[list[Any], None]]

#: HTTP status -> gRPC status. 429 (a rate limit, a key's own limit, a locked-out address) is RESOURCE_EXHAUSTED:
#: the client asked for more than its share and should back off; 503 (queue full, loading, draining, a worker
#: gone) is UNAVAILABLE, the code gRPC clients retry by policy.
GRPC_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_REQUEST_ID = "x-request-id"
#: The path a stream's opening stands for, for the key check (its messages are each `/v2/models/M/infer`).
_STREAM_PATH = "/v2/models/stream/infer"
_TIMEOUT = TIMEOUT_HEADER.lower()
_PRIORITY = PRIORITY_HEADER.lower()


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status for an HTTP status (INTERNAL for any other 5xx, INVALID_ARGUMENT for any other 4xx)."""
    return GRPC_CODES.get(status, grpc.StatusCode.INTERNAL if status >= 500 else grpc.StatusCode.INVALID_ARGUMENT)


class _Metadata(dict[str, str]):
    """A call's invocation metadata as request headers (keys are lowercase in gRPC; binary values skipped)."""

    def __init__(self, context: aio.ServicerContext[Any, Any]) -> None:
        super().__init__((k, v) for k, v in (context.invocation_metadata() or ()) if isinstance(v, str))

    def get(self, key: str, default: Any = None, /) -> Any:
        return super().get(key.lower(), default)


def _peer(context: aio.ServicerContext[Any, Any]) -> str | None:
    """The client's address from grpc's `ipv4:1.2.3.4:5` / `ipv6:[::1]:5` peer string."""
    peer: str = context.peer()
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Every RPC of the service over `service`, predicting with `predict` (the front's way of waiting)."""

    def __init__(
        self, service: Service, predict: Predict, stream: Stream, backlog: Callable[[], int | None] = lambda: None
    ) -> None:
        self.service = service
        self.predict = predict
        self.stream = stream
        #: How many calls wait for a thread (the sync architecture's shedding, as its HTTP front's); None: none.
        self.backlog = backlog
        #: Set when the server drains: new inference calls are refused with UNAVAILABLE.
        self.draining = False

    # -- the one lifecycle -------------------------------------------------------------------------------
    def _open(self, context: Any, metadata: _Metadata, endpoint: str, path: str, model: str) -> Exchange:
        """The call's exchange; the caller authenticates it first thing and closes it once."""
        return Exchange.open(self.service, endpoint, "GRPC", path, metadata, metadata.get(_REQUEST_ID), model=model)

    async def _call(
        self,
        context: aio.ServicerContext[Any, Any],
        endpoint: str,
        path: str,
        model: str,
        answer: Callable[[Exchange, _Metadata], Awaitable[M]],
        empty: M,
    ) -> M:
        """Open the exchange, authenticate, `answer`, fail with the mapped status, close once."""
        metadata = _Metadata(context)
        exchange = self._open(context, metadata, endpoint, path, model)
        context.set_trailing_metadata(((_REQUEST_ID, exchange.request_id),))
        try:
            exchange.authenticate(metadata, _peer(context))
            message = await answer(exchange, metadata)
            exchange.responded(200)
            return message
        except asyncio.CancelledError:
            raise  # the client left: the exchange closes unanswered (499)
        except Exception as exc:
            error = exchange.failed(exc)
            context.set_code(grpc_code(error.status))
            context.set_details(error.message)
            return empty
        finally:
            exchange.close()

    # -- health and metadata -----------------------------------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ServerLiveResponse:
            return pb.ServerLiveResponse(live=True)

        return await self._call(context, "live", "/v2/health/live", "", answer, pb.ServerLiveResponse())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=self.service.ready().status == 200 and not self.draining)

        return await self._call(context, "ready", "/v2/health/ready", "", answer, pb.ServerReadyResponse())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ModelReadyResponse:
            runtime = self.service.v2_runtime(request.name, request.version or None)
            return pb.ModelReadyResponse(ready=runtime.ready)

        path = f"/v2/models/{request.name}/ready"
        return await self._call(context, "model_ready", path, request.name, answer, pb.ModelReadyResponse())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ServerMetadataResponse:
            return pb.ServerMetadataResponse(**orjson.loads(self.service.server_metadata().body))

        return await self._call(context, "server_metadata", "/v2", "", answer, pb.ServerMetadataResponse())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ModelMetadataResponse:
            reply = self.service.v2_model_metadata(request.name, request.version or None)
            return metadata_message(orjson.loads(reply.body))

        path = f"/v2/models/{request.name}"
        return await self._call(context, "v2_model_metadata", path, request.name, answer, pb.ModelMetadataResponse())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ModelConfigResponse:
            reply = self.service.model_config(request.name, request.version or None)
            return pb.ModelConfigResponse(config=config_message(orjson.loads(reply.body)))

        path = f"/v2/models/{request.name}/config"
        return await self._call(context, "model_config", path, request.name, answer, pb.ModelConfigResponse())

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ModelStatisticsResponse:
            reply = self.service.model_stats(request.name or None, request.version or None)
            return statistics_message(orjson.loads(reply.body)["model_stats"])

        path = f"/v2/models/{request.name}/stats" if request.name else "/v2/models/stats"
        return await self._call(context, "model_stats", path, request.name, answer, pb.ModelStatisticsResponse())

    # -- inference -----------------------------------------------------------------------------------------
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        async def answer(exchange: Exchange, metadata: _Metadata) -> pb.ModelInferResponse:
            return await self._infer(exchange, metadata, request, context)

        path = f"/v2/models/{request.model_name}/infer"
        return await self._call(context, "infer", path, request.model_name, answer, pb.ModelInferResponse())

    async def _infer(
        self, exchange: Exchange, metadata: _Metadata, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        """Admit from the message head, decode with the V2 codec, predict, encode (service/drive.py)."""
        call = _Call(self, request, context)
        return response_message(
            *await drive.ainfer_message(exchange, self._head(metadata, request), call, _framed, _predict)
        )

    def _head(self, metadata: _Metadata, request: pb.ModelInferRequest) -> RequestHead:
        """The message's head, for admission; a draining server refuses the message first."""
        if self.draining:
            raise ShuttingDown("the server is shutting down: send this request again")
        return RequestHead(
            "infer",
            request.model_name,
            request.model_version or None,
            content_length=request.ByteSize(),
            timeout=metadata.get(_TIMEOUT),
            priority=metadata.get(_PRIORITY),
            headers=metadata,  # a traffic split's sticky key
            backlog=self.backlog(),
        )

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request of the stream answered in turn, each its own exchange: one response, or one per step of a
        streaming model. A failure is that request's `error_message` and the stream goes on (as in Triton).

        Like an HTTP connection, a stream is not held for free: with keys on, it is opened only with one
        (UNAUTHENTICATED at once, before any message), and between two messages the client may be silent for
        `--read-timeout-s` at most (then DEADLINE_EXCEEDED). Idle connections are closed by grpc itself
        (`grpc.max_connection_idle_ms`, `start_grpc_server`)."""
        metadata = _Metadata(context)
        try:
            if self.service.requires_auth(_STREAM_PATH):
                self.service.authenticate(metadata, _peer(context))  # each message is authenticated too
        except TwinserveError as exc:
            await context.abort(grpc_code(exc.status), exc.message)
        idle = self.service.config.read_timeout_s
        messages = aiter(request_iterator)
        while True:
            try:
                async with asyncio.timeout(idle):
                    request = await anext(messages)
            except StopAsyncIteration:
                return
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"no message on this stream for {idle:g} s (--read-timeout-s)"
                )
            async with aclosing(self._streamed(request, context)) as responses:  # see `_streamed`
                async for response in responses:
                    yield response

    async def _streamed(
        self, request: pb.ModelInferRequest, context: Any
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        path = f"/v2/models/{request.model_name}/infer"
        metadata = _Metadata(context)
        exchange = self._open(context, metadata, "infer", path, request.model_name)
        try:
            exchange.authenticate(metadata, _peer(context))
            call = _Call(self, request, context)
            head = self._head(metadata, request)
            # One message, or one per step of a streaming model: their order and encoding are the driver's. Each
            # generator closes the one it iterates (`aclosing`): an RPC cancelled while a response is being sent
            # leaves them at a `yield`, and the model's steps would close only as asyncio finalised each in turn.
            messages = drive.ainfer_messages(exchange, head, call, _framed, _predict, _stream)
            async with aclosing(messages):
                async for message in messages:
                    yield pb.ModelStreamInferResponse(infer_response=response_message(*message))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            yield pb.ModelStreamInferResponse(error_message=exchange.failed(exc).message)
        finally:
            exchange.close()


@dataclass(frozen=True, slots=True)
class _Call:
    """One inference message and its call, the `source` the driver hands back to the steps below."""

    servicer: InferenceServicer
    request: pb.ModelInferRequest
    context: aio.ServicerContext[Any, Any]


def _framed(call: _Call, exchange: Exchange) -> drive.Framed:
    """The admitted message as the V2 codec reads it (no REST body between), the gRPC deadline first tightening
    the admitted one (capped like a timeout header)."""
    remaining = call.context.time_remaining()
    if remaining is not None:
        exchange.deadline = exchange.service.admission.tighten(exchange.deadline, max(1, int(remaining * 1e6)))
    return infer_message(call.request)


def _predict(call: _Call, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Awaitable[list[Any]]:
    """The servicer's way of waiting for the model (on the loop, or on a worker thread)."""
    return call.servicer.predict(runtime, instances, deadline)


def _stream(
    call: _Call, runtime: ModelRuntime, instances: list[Any], deadline: float | None
) -> AsyncGenerator[list[Any], None]:
    """The servicer's way of stepping a streaming model (on the loop, or each step on a worker thread)."""
    return call.servicer.stream(runtime, instances, deadline)


async def astream(
    runtime: ModelRuntime, instances: list[Any], deadline: float | None
) -> AsyncGenerator[list[Any], None]:
    """A streaming model's steps on the event loop (async, hybrid)."""
    steps = await runtime.astream(instances, deadline)
    try:
        async for step in steps:
            yield step
    finally:
        await steps.aclose()


async def stream_on_threads(
    runtime: ModelRuntime, instances: list[Any], deadline: float | None
) -> AsyncGenerator[list[Any], None]:
    """A streaming model's steps from its blocking generator, each stepped on a worker thread (sync)."""
    steps = await asyncio.to_thread(runtime.stream, instances, deadline)
    try:
        while (step := await asyncio.to_thread(next, steps, None)) is not None:
            yield step
    finally:
        await asyncio.to_thread(steps.close)


async def start_grpc_server(
    service: Service,
    config: Config,
    predict: Predict,
    stream: Stream = astream,
    backlog: Callable[[], int | None] = lambda: None,
) -> tuple[aio.Server, InferenceServicer]:
    """A started `grpc.aio` server on `config.grpc_port`, on the running loop. Messages past `--max-body-bytes`
    are refused by grpc itself (RESOURCE_EXHAUSTED) before they are read whole."""
    assert config.grpc_port is not None
    server = aio.server(
        interceptors=[RefuseMalformed()],  # INVALID_ARGUMENT and one log line an interval, not a traceback each
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),  # worker processes share the port, as they share the HTTP socket
            # A connection with no call for --read-timeout-s is closed (GOAWAY), as an idle HTTP connection is.
            ("grpc.max_connection_idle_ms", int(config.read_timeout_s * 1000)),
        ],
    )
    servicer = InferenceServicer(service, predict, stream, backlog)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    host = f"[{config.host}]" if ":" in config.host else config.host
    if server.add_insecure_port(f"{host}:{config.grpc_port}") == 0:  # some grpcio versions say so, not raise
        raise RuntimeError(f"--grpc-port {config.grpc_port}: the port could not be bound on {config.host}")
    await server.start()
    return server, servicer


async def stop_grpc_server(server: aio.Server, servicer: InferenceServicer, grace: float) -> None:
    """Drain: refuse new calls, give those in flight `grace` seconds, then cancel what is left."""
    servicer.draining = True
    await server.stop(grace)


class GrpcThread:
    """The sync architecture's gRPC server: a `grpc.aio` server on an event loop of its own thread, whose predict
    calls block worker threads (`ModelRuntime.predict`, the sync front's thread batcher) rather than the loop."""

    def __init__(self, service: Service, config: Config) -> None:
        self.service, self.config = service, config
        self.loop = asyncio.new_event_loop()
        # As many calls computing at once as the worker's HTTP threads (`--threads`), not asyncio's default pool.
        self.loop.set_default_executor(ThreadPoolExecutor(config.threads, thread_name_prefix="twinserve-grpc"))
        self._server: tuple[aio.Server, InferenceServicer] | None = None
        self._started = threading.Event()
        self._calls = 0
        self._thread = threading.Thread(target=self._run, name="twinserve-grpc", daemon=True)

    async def _predict(self, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> list[Any]:
        self._calls += 1  # on the loop's one thread: no lock
        try:
            return await asyncio.to_thread(runtime.predict, instances, deadline)
        finally:
            self._calls -= 1

    def _backlog(self) -> int:
        """Calls waiting for one of the `--threads` threads: past `--max-queue`, the next is shed (503)."""
        return max(0, self._calls - self.config.threads)

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._server is None:
            raise RuntimeError(f"the gRPC server could not start on port {self.config.grpc_port}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self._server = self.loop.run_until_complete(
                start_grpc_server(self.service, self.config, self._predict, stream_on_threads, self._backlog)
            )
        except Exception:
            logger.exception("the gRPC server failed to start")
        finally:
            self._started.set()
        if self._server is not None:
            self.loop.run_forever()

    def stop(self, grace: float) -> None:
        """Drain the server (from any thread) and stop its loop."""
        if self._server is None:
            return
        server, servicer = self._server
        future = asyncio.run_coroutine_threadsafe(stop_grpc_server(server, servicer, grace), self.loop)
        try:
            future.result(grace + 5)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
