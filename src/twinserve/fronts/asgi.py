"""The async front: a plain ASGI app; one event loop serves every connection, model work is awaited (S9, S10).

Every request, HTTP or WebSocket, goes through one dispatcher compiled from the shared route table
(fronts/dispatch.py) to a plain endpoint over the shared `Service`; the lifespan loads the models
(fronts/asgi_lifespan.py), and the allowed-hosts and CORS layers wrap the app (fronts/asgi_middleware.py). No web
framework runs per request: Starlette's `Request` and `WebSocket` only read ASGI messages, and a reply is sent
as two ASGI messages (fronts/asgi_reply.py).
FastAPI is not used: its per-request dependency and validation machinery duplicated what the codec already does
in one pass, and its router was routed around on the hot path. `/docs` and `/openapi.json` come from the shared
route table, built from each model's own schemas.

A request whose client leaves while it waits is never computed: the server tells (fronts/disconnect.py) or a
watcher task awaiting `http.disconnect` does.

`:stream` answers with Server-Sent Events written straight to ASGI (`AsgiEventStream`): one step is computed at a
time, only while the client is there; when uvicorn reports `http.disconnect` the step in progress is cancelled
(an async generator stops at its await; a step on a thread or in a model worker finishes) and the generator is
closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from twinserve.core.admission import PRIORITY_HEADER, TIMEOUT_HEADER
from twinserve.core.streams import AsyncSteps
from twinserve.errors import ClientDisconnected, TwinserveError, UpgradeRequired
from twinserve.fronts.asgi_lifespan import AsgiLifespan
from twinserve.fronts.asgi_middleware import CorsMiddleware, TrustedHostsMiddleware
from twinserve.fronts.asgi_reply import AsgiReply
from twinserve.fronts.disconnect import arrived_body, predict_unless_gone, unless_disconnected
from twinserve.fronts.dispatch import ROUTE_ERRORS, Dispatcher
from twinserve.fronts.sse import AsgiEventStream
from twinserve.fronts.websocket import OpenSockets, websocket_endpoint
from twinserve.protocol.v2 import HEADER_LENGTH
from twinserve.service.admission import RequestHead
from twinserve.service.compression import compress_reply
from twinserve.service.contract import Reply, Service
from twinserve.service.drive import StreamStart, ainfer, astreamed
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import BodyRule
from twinserve.service.routes import REQUEST_ID_HEADER, ROUTES, ErrorShape, error_shape

__all__ = ["create_asgi_app"]

logger = logging.getLogger("twinserve.asgi")


async def _read_body(request: Request, rule: BodyRule) -> bytes:
    """The request body, refusing (413) as soon as it grows past the limit, chunked or not: the reading here, the
    decisions the service's `BodyRule` (service/lifecycle.py), the sync front's too.

    uvicorn bounds no read: a body that has not arrived whole within `--read-timeout-s` gets 408 and its
    connection closed, instead of holding the request open forever (slowloris). The bound is on the whole body,
    not on each pause, so a byte every few seconds does not keep it open either; the sync architecture's
    gunicorn workers apply the same deadline. A body that had all arrived when the app first ran (most) is taken
    whole from the server (`arrived_body`): there is nothing left to wait for.
    """
    arrived = arrived_body(request)
    if arrived is not None:  # whole: only the rule's limit to compare (the hot path: no call for one comparison)
        if len(arrived) > rule.max_bytes:
            raise rule.too_large()
        return arrived
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(rule.read_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                rule.within(size)
                chunks.append(chunk)
    except ClientDisconnect:  # uvicorn takes a half-closed connection for a departed client: nobody to answer
        raise ClientDisconnected("the client closed the connection before the whole body arrived") from None
    except TimeoutError:
        raise rule.late() from None
    return b"".join(chunks)


def _length(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _head(scope: Scope) -> dict[str, str]:
    """The request's headers by (lower-case) name, the first of a repeated one as starlette's `Headers.get` gives:
    one pass over the list for the hot path's dozen look-ups, where each `Headers.get` scans it again; made once
    per request (kept in the scope)."""
    found: dict[str, str] | None = scope.get(_HEAD)
    if found is None:
        found = scope[_HEAD] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1")
            if key not in found:
                found[key] = value.decode("latin-1")
    return found


_HEAD = "twinserve.head"


#: What a handler answers: a complete reply, or a stream (fronts/sse.py), each sent by calling it as ASGI.
Answer = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Request], Awaitable[Answer]]
Endpoint = Callable[[Request, Exchange], Awaitable[Reply | StreamStart[AsyncSteps]]]


WebSocketEndpoint = Callable[[WebSocket], Awaitable[None]]


class _Target:
    """What a route dispatches to: its HTTP handler and, on the WebSocket route, its socket endpoint."""

    __slots__ = ("handle", "socket")

    def __init__(self, handle: Handler, socket: WebSocketEndpoint | None = None) -> None:
        self.handle, self.socket = handle, socket


def create_asgi_app(
    service: Service,
    sockets: OpenSockets | None = None,
    on_ready: Callable[[], None] | None = None,
    on_startup_failure: Callable[[BaseException], str] | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> ASGIApp:
    """The ASGI app serving the shared route table over `service`; models load in its lifespan.

    Its WebSocket sockets are kept in `sockets`, for the server to drain at shutdown. `on_ready` is called once the
    models have loaded (a serving process settles its heap: core/heap.py). `on_startup_failure` reports a startup
    that failed and answers the one line the server is told (`lifespan.startup.failed`'s message, which the server
    logs); without it, the message is the traceback.

    Without `on_load_failure` the startup completes once the models have loaded (Ray's replicas, the tests'
    in-process apps). With it the startup completes at once and the models load in a task on the loop: the server
    answers meanwhile, live and not ready (`ModelRegistry.starting`), and a request for a model still loading waits
    for it (repository/residency.py); a model of the MODEL arguments that fails to load goes to `on_load_failure`,
    the server's to report and stop (the lifespan protocol has no failure after a completed startup).
    """
    if sockets is None:
        sockets = OpenSockets()
    endpoints = _endpoints(service)
    socket = websocket_endpoint(service, sockets)
    dispatcher = Dispatcher(
        (
            route,
            _Target(
                _handled(service, route.name, endpoints[route.name], shape=error_shape(route.path)),
                socket if route.name == "websocket" else None,
            ),
        )
        for route in ROUTES
    )
    lifespan = AsgiLifespan(service, on_ready, on_startup_failure, on_load_failure)
    app: ASGIApp = _AsgiFront(service, dispatcher, lifespan)
    if service.cors is not None:
        app = CorsMiddleware(app, service)
    # Outermost: a request naming a foreign host gets nothing else, not even a preflight's answer.
    return TrustedHostsMiddleware(app, service) if service.checks_host else app


class _AsgiFront:
    """The lifespan (fronts/asgi_lifespan.py), then every request through the dispatcher."""

    def __init__(self, service: Service, dispatcher: Dispatcher[_Target], lifespan: AsgiLifespan) -> None:
        self.service = service
        self.match = dispatcher.match
        self.lifespan = lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                target, scope["path_params"] = self.match(scope["method"], _route_path(scope))
            except ROUTE_ERRORS as exc:
                await self._no_route(scope, receive, send, exc)
                return
            response = await target.handle(Request(scope, receive, send))
            await response(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(scope, receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            target, params = self.match("GET", _route_path(scope))
        except ROUTE_ERRORS:
            target, params = None, {}
        if target is None or target.socket is None:  # refused as a router refuses it: close before accept
            await send({"type": "websocket.close", "code": 1000, "reason": ""})
            return
        scope["path_params"] = params
        await target.socket(WebSocket(scope, receive, send))

    async def _no_route(self, scope: Scope, receive: Receive, send: Send, error: TwinserveError) -> None:
        """404 or 405, unless API keys are on and none was presented: then 401, as on a known path (no probing
        for routes without a key)."""
        request = Request(scope, receive, send)
        path, headers = scope["path"], request.headers
        exchange = Exchange.open(
            self.service,
            "unknown",
            request.method,
            path,
            headers,
            headers.get(REQUEST_ID_HEADER),
            shape=error_shape(path),
        )
        reply = exchange.fail(_refusal(exchange, request) or error)
        exchange.close()
        await AsgiReply(reply, exchange.request_id)(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path the routes are matched against: the scope's, less the `root_path` a server mounts the app at."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


_TIMEOUT, _PRIORITY, _HEADER_LENGTH = TIMEOUT_HEADER.lower(), PRIORITY_HEADER.lower(), HEADER_LENGTH.lower()
_REQUEST_ID = REQUEST_ID_HEADER.lower()


def _endpoints(service: Service) -> dict[str, Endpoint]:
    """Each route's endpoint, by route name."""

    body_rule = service.body  # what the repository API's body is judged by, as an inference body is

    def request_head(request: Request, exchange: Exchange) -> RequestHead:
        """The head admission reads, from the request's header dict (`_head`), once."""
        params = request.path_params
        headers = _head(request.scope)
        endpoint = exchange.endpoint
        return RequestHead(
            endpoint,
            params["model"],
            params.get("version"),
            headers.get("content-type"),
            _length(headers.get("content-length")),
            headers.get("content-encoding"),
            headers.get(_TIMEOUT),
            headers.get(_PRIORITY),
            headers.get(_HEADER_LENGTH) if endpoint == "infer" else None,  # V2's binary data
            headers,  # a traffic split's sticky key (its name looked up in lower case)
        )

    def infer(request: Request, exchange: Exchange) -> Awaitable[Reply]:
        """V1 `:predict` and V2 `/infer` alike: the exchange's codec is the endpoint's. The driver's coroutine is
        the endpoint's own (no coroutine of its own around it: one frame fewer each time the request resumes)."""
        return ainfer(exchange, request_head(request, exchange), request, _read_body, predict_unless_gone)

    def stream(request: Request, exchange: Exchange) -> Awaitable[StreamStart[AsyncSteps]]:
        """`:stream`, up to its first step, which is waited for only while the client is there (service/drive.py);
        the rest is `AsgiEventStream`'s."""
        return astreamed(exchange, request_head(request, exchange), request, _read_body, unless_disconnected)

    def plain(handler: Callable[[], Reply]) -> Endpoint:
        async def endpoint(request: Request, exchange: Exchange) -> Reply:
            return handler()

        endpoint.__name__ = handler.__name__
        return endpoint

    def model_route(handler: Callable[[str, str | None], Reply]) -> Endpoint:
        async def endpoint(request: Request, exchange: Exchange) -> Reply:
            return handler(request.path_params["model"], request.path_params.get("version"))

        endpoint.__name__ = handler.__name__
        return endpoint

    async def model_metadata(request: Request, exchange: Exchange) -> Reply:
        return service.model_metadata(request.path_params["model"])

    async def websocket(request: Request, exchange: Exchange) -> Reply:
        raise UpgradeRequired(
            f"{request.url.path} is a WebSocket endpoint: connect with a WebSocket client (Upgrade: websocket)",
            headers={"Upgrade": "websocket", "Connection": "Upgrade"},
        )

    async def repository_load(request: Request, exchange: Exchange) -> Reply:
        return await service.repository.aload(exchange.key_id, request.path_params["model"])

    async def repository_unload(request: Request, exchange: Exchange) -> Reply:
        return await service.repository.aunload(exchange.key_id, request.path_params["model"])

    async def repository_traffic(request: Request, exchange: Exchange) -> Reply:
        return service.repository.traffic(request.path_params["model"])

    async def repository_set_traffic(request: Request, exchange: Exchange) -> Reply:
        body = await _read_body(request, body_rule)
        return service.repository.set_traffic(exchange.key_id, request.path_params["model"], body)

    async def model_stats(request: Request, exchange: Exchange) -> Reply:
        return service.model_stats(request.path_params.get("model"), request.path_params.get("version"))

    return {
        "alive": plain(service.alive),
        "list_models": plain(service.list_models),
        "model_metadata": model_metadata,
        "predict": infer,
        "stream": stream,
        "websocket": websocket,
        "live": plain(service.live),
        "ready": plain(service.ready),
        "server_metadata": plain(service.server_metadata),
        "v2_model_metadata": model_route(service.v2_model_metadata),
        "model_ready": model_route(service.model_ready),
        "infer": infer,
        "model_config": model_route(service.model_config),
        "model_stats": model_stats,
        "repository_index": plain(service.repository.index),
        "repository_load": repository_load,
        "repository_unload": repository_unload,
        "repository_traffic": repository_traffic,
        "repository_set_traffic": repository_set_traffic,
        "openapi": plain(service.openapi),
        "docs": plain(service.docs),
        "docs_css": plain(lambda: service.docs_asset("docs_css")),
        "docs_js": plain(lambda: service.docs_asset("docs_js")),
        "metrics": plain(service.metrics),
    }


def _refusal(exchange: Exchange, request: Request) -> TwinserveError | None:
    try:
        exchange.authenticate(request.headers, _client(request.scope))
    except TwinserveError as exc:
        return exc
    return None


def _client(scope: Scope) -> str | None:
    """The client's address: the peer's, or the one uvicorn took from `X-Forwarded-For` when the peer is a proxy
    it trusts (`FORWARDED_ALLOW_IPS`)."""
    client = scope.get("client")
    return client[0] if client else None


def _handled(service: Service, name: str, endpoint: Endpoint, shape: ErrorShape = "twinserve") -> Handler:
    """Wrap an endpoint in its exchange: request id in and out, every error rendered by the shared contract (with
    the V2 body on V2 routes), the request counted once (a stream's when it ends)."""

    async def handle(request: Request) -> Answer:
        headers = _head(request.scope)
        exchange = Exchange.open(
            service,
            name,
            request.method,
            request.scope["path"],
            headers,
            headers.get(_REQUEST_ID),
            model=request.path_params.get("model", ""),
            shape=shape,
        )
        try:
            exchange.authenticate(headers, _client(request.scope))
            answer = await endpoint(request, exchange)
            if isinstance(answer, StreamStart):
                return AsgiEventStream(exchange, answer)  # it closes the exchange
            reply = exchange.reply(answer)
        except Exception as exc:
            reply = exchange.fail(exc)
        exchange.close()
        return AsgiReply(compress_reply(reply, headers.get("accept-encoding")), exchange.request_id)

    handle.__name__ = endpoint.__name__
    return handle
