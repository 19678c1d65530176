"""The async front: a FastAPI app; one event loop serves every connection, model work is awaited (S9, S10).

The routes are plain Starlette endpoints over the shared `Service`: FastAPI's per-request dependency and
validation machinery would only duplicate what the codec already does in one pass. `/docs` and
`/openapi.json` come from the shared route table, built from each model's own schemas.

`:stream` answers with Server-Sent Events written straight to ASGI (`_EventStream`): one step is computed at a
time, only while the client is there; when uvicorn reports `http.disconnect` the step in progress is cancelled
(an async generator stops at its await; a step on a thread or in a model worker finishes) and the generator is
closed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import Headers as StarletteHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from twinserve import __version__
from twinserve.core.admission import TIMEOUT_HEADER
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import (
    ClientDisconnected,
    ClientError,
    MethodNotAllowed,
    NotFound,
    RequestTimeout,
    TwinserveError,
    UpgradeRequired,
)
from twinserve.fronts.contract import Reply, Service
from twinserve.fronts.exchange import Exchange
from twinserve.fronts.routes import MODEL_NAME_PATTERN, REQUEST_ID_HEADER, ROUTES, is_v2
from twinserve.fronts.sse import AsgiEventStream, StreamStart, client_left, step_or_none
from twinserve.fronts.websocket import OpenSockets, websocket_endpoint
from twinserve.observability.metrics import mark_process_dead
from twinserve.protocol.v2 import HEADER_LENGTH

__all__ = ["create_asgi_app"]

logger = logging.getLogger("twinserve.asgi")

T = TypeVar("T")


class _ModelNameConvertor(Convertor[str]):
    regex = MODEL_NAME_PATTERN

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("model", _ModelNameConvertor())


def _respond(reply: Reply, request_id: str) -> Response:
    headers = {REQUEST_ID_HEADER: request_id}
    if reply.headers:
        headers.update(reply.headers)
    return Response(reply.body, status_code=reply.status, headers=headers, media_type=reply.content_type or None)


async def _read_body(request: Request, service: Service) -> bytes:
    """The request body, refusing (413) as soon as it grows past the limit, chunked or not.

    uvicorn bounds no read: a client that pauses longer than `--read-timeout-s` between two pieces of its body
    gets 408 and its connection closed, instead of holding the request open forever (slowloris).
    """
    chunks: list[bytes] = []
    size = 0
    pause = service.config.read_timeout_s
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + pause) as timer:
            async for chunk in request.stream():
                size += len(chunk)
                if size > service.max_body_bytes:
                    raise service.too_large()
                chunks.append(chunk)
                timer.reschedule(loop.time() + pause)
    except ClientDisconnect:  # uvicorn takes a half-closed connection for a departed client: nobody to answer
        raise ClientDisconnected("the client closed the connection before the whole body arrived") from None
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {pause:g} s (--read-timeout-s)", headers={"Connection": "close"}
        ) from None
    return b"".join(chunks)


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value and value.isdigit() else None


def _disconnect_flag(request: Request) -> Callable[[], bool] | None:
    """uvicorn's per-request `disconnected` flag, read without a task; None under another server.

    Polling the flag when a batch is formed is ~10% cheaper per request (measured) than a watcher task awaiting
    `http.disconnect`, and enough to keep a departed client's request from being computed.
    """
    cycle = getattr(request.receive, "__self__", None)
    if cycle is None or not isinstance(getattr(cycle, "disconnected", None), bool):
        return None
    return lambda: bool(cycle.disconnected)


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await `work`, cancelling it if the client goes away first (a queued request then leaves the queue).

    One watcher task per request, which cancels this one on disconnect: cheaper than running `work` as a task too.
    """
    current = asyncio.current_task()
    assert current is not None
    waiting = True

    def on_disconnect(watcher: asyncio.Task[None]) -> None:
        if waiting and not watcher.cancelled():
            current.cancel()

    watcher = asyncio.get_running_loop().create_task(client_left(request.receive))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled() and current.uncancel() == 0:
            raise ClientDisconnected("the client closed the connection before the answer was ready") from None
        raise
    finally:
        waiting = False
        watcher.cancel()


async def _predict(request: Request, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
    """The outputs for `instances`, unless the client leaves first (then they are never computed)."""
    gone = _disconnect_flag(request)
    if gone is not None:
        return await runtime.apredict(instances, deadline, gone)
    return await _unless_disconnected(request, runtime.apredict(instances, deadline))


def _v2_path_params(middle: str) -> dict[str, str] | None:
    """`{model}` or `{model}/versions/{version}` (the part of a V2 infer path between its prefix and suffix)."""
    parts = middle.split("/")
    if len(parts) == 3 and parts[1] == "versions":
        model, version = parts[0], parts[2]
        return {"model": model, "version": version} if model and version and ":" not in model else None
    return {"model": middle} if len(parts) == 1 and middle and ":" not in middle else None


Handler = Callable[[Request], Awaitable[Response]]


class _PredictFastPath:
    """`POST /v1/models/{name}:predict` and `POST /v2/models/{name}[/versions/{v}]/infer` straight to their
    handlers; everything else through the FastAPI app.

    Profiling showed FastAPI's middleware stack and router costing more per predict than the handler itself; the
    handler and its error rendering are the same either way. V1 is matched first, so V2 costs it nothing.
    """

    prefix, suffix = "/v1/models/", ":predict"
    v2_prefix, v2_suffix = "/v2/models/", "/infer"

    def __init__(self, app: FastAPI, predict: Handler, infer: Handler) -> None:
        self.app = app
        self.predict = predict
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(self.prefix) and path.endswith(self.suffix):
                name = path[len(self.prefix) : -len(self.suffix)]
                if name and "/" not in name and ":" not in name:
                    scope["path_params"] = {"model": name}
                    response = await self.predict(Request(scope, receive, send))
                    await response(scope, receive, send)
                    return
            elif path.startswith(self.v2_prefix) and path.endswith(self.v2_suffix):
                params = _v2_path_params(path[len(self.v2_prefix) : -len(self.v2_suffix)])
                if params is not None:
                    scope["path_params"] = params
                    response = await self.infer(Request(scope, receive, send))
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


Endpoint = Callable[[Request, Exchange], Awaitable[Reply | StreamStart]]


def create_asgi_app(service: Service, sockets: OpenSockets | None = None) -> ASGIApp:
    """A FastAPI app serving the shared route table over `service`; models load in its lifespan.

    Its WebSocket sockets are kept in `sockets`, for the server to drain at shutdown.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for runtime in service.runtimes.values():
            await runtime.aload()
        yield
        for runtime in service.runtimes.values():
            await runtime.aclose()
        mark_process_dead(os.getpid())  # this worker's live gauges leave the aggregate with it
        if service.tracer is not None:
            service.tracer.shutdown()

    # /openapi.json and /docs come from the shared route table, so both architectures document the same API.
    if sockets is None:
        sockets = OpenSockets()
    app = FastAPI(
        title="twinserve",
        version=__version__,
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        **_without_fastapi_tracing(),
    )
    # No automatic slash redirects: `/v2/` answers 404 as in the sync front, and no Location is ever built from
    # the client's Host header before authentication.
    app.router.redirect_slashes = False

    async def infer(request: Request, exchange: Exchange) -> Reply:
        """V1 `:predict` and V2 `/infer` alike: the exchange's codec is the endpoint's."""
        params, headers = request.path_params, request.headers
        runtime = exchange.admit(
            params["model"],
            params.get("version"),
            content_type=headers.get("content-type"),
            content_length=_content_length(request),
            timeout_header=headers.get(TIMEOUT_HEADER),
        )
        instances = exchange.decode(await _read_body(request, service), headers.get(HEADER_LENGTH))
        return exchange.encode(await _predict(request, runtime, instances, exchange.deadline))

    async def stream(request: Request, exchange: Exchange) -> StreamStart:
        headers = request.headers
        runtime = exchange.admit(
            request.path_params["model"],
            content_type=headers.get("content-type"),
            content_length=_content_length(request),
            timeout_header=headers.get(TIMEOUT_HEADER),
        )
        instances = exchange.decode(await _read_body(request, service))
        steps = await runtime.astream(instances, exchange.deadline)
        try:
            # Errors up to the first step are answered like :predict's, with their status and JSON body.
            first = await _unless_disconnected(request, step_or_none(steps))
        except BaseException:
            await steps.aclose()
            raise
        return StreamStart(runtime, steps, first, len(instances))

    async def list_models(request: Request, exchange: Exchange) -> Reply:
        return service.list_models()

    async def model_metadata(request: Request, exchange: Exchange) -> Reply:
        return service.model_metadata(request.path_params["model"])

    async def live(request: Request, exchange: Exchange) -> Reply:
        return service.live()

    async def ready(request: Request, exchange: Exchange) -> Reply:
        return service.ready()

    async def openapi(request: Request, exchange: Exchange) -> Reply:
        return service.openapi()

    async def docs(request: Request, exchange: Exchange) -> Reply:
        return service.docs()

    async def metrics_(request: Request, exchange: Exchange) -> Reply:
        return service.metrics()

    async def server_metadata(request: Request, exchange: Exchange) -> Reply:
        return service.server_metadata()

    def model_route(handler: Callable[[str, str | None], Reply]) -> Endpoint:
        async def endpoint(request: Request, exchange: Exchange) -> Reply:
            return handler(request.path_params["model"], request.path_params.get("version"))

        endpoint.__name__ = handler.__name__
        return endpoint

    async def websocket(request: Request, exchange: Exchange) -> Reply:
        raise UpgradeRequired(
            f"{request.url.path} is a WebSocket endpoint: connect with a WebSocket client (Upgrade: websocket)",
            headers={"Upgrade": "websocket", "Connection": "Upgrade"},
        )

    async def model_stats(request: Request, exchange: Exchange) -> Reply:
        return service.model_stats(request.path_params.get("model"), request.path_params.get("version"))

    endpoints: dict[str, Endpoint] = {
        "list_models": list_models,
        "model_metadata": model_metadata,
        "predict": infer,
        "stream": stream,
        "websocket": websocket,
        "live": live,
        "ready": ready,
        "server_metadata": server_metadata,
        "v2_model_metadata": model_route(service.v2_model_metadata),
        "model_ready": model_route(service.model_ready),
        "infer": infer,
        "model_config": model_route(service.model_config),
        "model_stats": model_stats,
        "openapi": openapi,
        "docs": docs,
        "metrics": metrics_,
    }
    for route in ROUTES:
        path = route.path.replace("{model}", "{model:model}").replace("{version}", "{version:model}")
        handler = _handled(service, route.name, endpoints[route.name], v2=is_v2(route.path))
        app.router.add_route(path, handler, methods=[route.method], name=route.name)
        if route.name == "websocket":
            app.router.add_websocket_route(path, websocket_endpoint(service, sockets), name=route.name)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        path = request.scope["path"]
        exchange = service.open(
            "unknown", request.method, path, request.headers, request.headers.get(REQUEST_ID_HEADER), v2=is_v2(path)
        )
        error: TwinserveError
        # With API keys on, an unknown path is 401 like a known one: no probing for routes without a key.
        refusal = _refusal(exchange, request)
        if refusal is not None:
            error = refusal
        elif exc.status_code == 404:
            error = NotFound(f"no route for {request.method} {request.url.path}")
        elif exc.status_code == 405:
            error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
            error.headers.update(exc.headers or {})
        else:
            error = ClientError(str(exc.detail))
            error.status = exc.status_code  # type: ignore[misc]
        reply = exchange.fail(error)
        exchange.close()
        return _respond(reply, exchange.request_id)

    app.add_exception_handler(StarletteHTTPException, http_error)
    served = _PredictFastPath(app, _handled(service, "predict", infer), _handled(service, "infer", infer, v2=True))
    return served if service.cors is None else _Cors(served, service)


def _refusal(exchange: Exchange, request: Request) -> TwinserveError | None:
    try:
        exchange.authenticate(request.headers)
    except TwinserveError as exc:
        return exc
    return None


class _Cors:
    """The shared CORS policy (fronts/cors.py) around the whole app, fast path included: preflights answered
    here, before authentication; the policy's headers added to every other response."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service = self.service
        headers = StarletteHeaders(scope=scope)
        if service.is_preflight(scope["method"], headers):
            path = scope["path"]
            exchange = service.open(
                "preflight", scope["method"], path, headers, headers.get(REQUEST_ID_HEADER), v2=is_v2(path)
            )
            try:
                reply = exchange.reply(service.preflight(headers))
            except TwinserveError as exc:
                reply = exchange.fail(exc)
            exchange.close()
            await _respond(reply, exchange.request_id)(scope, receive, send)
            return
        assert service.cors is not None
        extra = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in service.cors.response_headers(headers.get("origin")).items()
        ]
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _without_fastapi_tracing() -> dict[str, Any]:
    """FastAPI with native telemetry (0.165 here) makes request spans of its own once a tracer provider is set:
    twinserve makes the one span per request, the same in both fronts (predict never passes through FastAPI)."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False}}
    return {}


def _handled(service: Service, name: str, endpoint: Endpoint, v2: bool = False) -> Handler:
    """Wrap an endpoint in its exchange: request id in and out, every error rendered by the shared contract (with
    the V2 body on V2 routes), the request counted once (a stream's when it ends)."""

    async def handle(request: Request) -> Response:
        headers = request.headers
        exchange = service.open(
            name,
            request.method,
            request.scope["path"],
            headers,
            headers.get(REQUEST_ID_HEADER),
            model=request.path_params.get("model", ""),
            v2=v2,
        )
        try:
            exchange.authenticate(headers)
            answer = await endpoint(request, exchange)
            if isinstance(answer, StreamStart):
                service.first_chunk(exchange.context, answer.runtime.name)
                return AsgiEventStream(exchange, answer)  # type: ignore[return-value]  # it closes the exchange
            reply = exchange.reply(answer)
        except Exception as exc:
            reply = exchange.fail(exc)
        exchange.close()
        return _respond(reply, exchange.request_id)

    handle.__name__ = endpoint.__name__
    return handle
