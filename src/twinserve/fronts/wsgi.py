"""The sync front: a Flask WSGI app; each request runs start to end in the thread that received it (S1, S3).

`:stream` answers with the same Server-Sent Events as the async front, sent with chunked transfer encoding: the
model's generator is stepped in the request thread as each event is written, and closed when a write fails
because the client has gone (gunicorn then closes the response iterable).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, Request, Response, g, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter

from twinserve.core.admission import PRIORITY_HEADER, TIMEOUT_HEADER
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import (
    ClientError,
    HostNotAllowed,
    MethodNotAllowed,
    NotFound,
    TwinserveError,
    WebSocketUnsupported,
)
from twinserve.fronts.sse import SSE_HEADERS, WsgiEventStream
from twinserve.protocol.v2 import HEADER_LENGTH
from twinserve.service import drive
from twinserve.service.admission import RequestHead
from twinserve.service.compression import compress_reply
from twinserve.service.contract import Reply, Service
from twinserve.service.cors import merge_vary
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import DECIDED, BodyRule
from twinserve.service.routes import EVENT_STREAM, MODEL_NAME_PATTERN, REQUEST_ID_HEADER, ROUTES, error_shape

__all__ = ["BACKLOG_ENVIRON", "create_wsgi_app"]

#: Set by the server (servers/sync/worker.py): requests still waiting for a request thread behind this one.
BACKLOG_ENVIRON = "twinserve.backlog"

logger = logging.getLogger("twinserve.wsgi")
_HOST_REFUSED = HostNotAllowed.code


class _ModelNameConverter(BaseConverter):
    regex = MODEL_NAME_PATTERN


def _respond(reply: Reply) -> Response:
    reply = compress_reply(reply, request.headers.get("Accept-Encoding"))
    response = Response(reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers)
    if not reply.content_type:
        del response.headers["Content-Type"]  # a 204 has no body to describe
    return response


def _translate(exc: HTTPException, service: Service) -> TwinserveError:
    """Werkzeug's own routing and limit errors, in twinserve's vocabulary."""
    if exc.code == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if exc.code == 405:
        allowed = getattr(exc, "valid_methods", None) or []
        error: TwinserveError = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        error.headers["Allow"] = ", ".join(allowed)
        return error
    if exc.code == 413:
        return service.too_large()
    error = ClientError(exc.description or exc.name)
    error.status = exc.code or 400  # type: ignore[misc]
    return error


def _read_body(request: Request, rule: BodyRule) -> bytes:
    """The request body, refusing (413) one byte past the limit, chunked or not; 408 if the client stalls: the
    reading here, the decisions the service's `BodyRule` (service/lifecycle.py), the async front's too."""
    try:
        declared = request.content_length
        if declared is not None:  # checked against the limit by the admission already
            # A body shorter than announced: the client closed its side early (400, never half a message).
            return rule.whole(request.get_data(cache=False), declared)
        # Chunked: the server de-chunks wsgi.input and marks its end (wsgi.input_terminated).
        body: bytes = request.environ["wsgi.input"].read(rule.read_limit)
    except TimeoutError:  # the server's socket read timeout (--read-timeout-s)
        raise rule.late() from None
    return rule.whole(body)


def _predict(request: Request, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
    """The outputs for `instances`, waited for in the request's thread."""
    return runtime.predict(instances, deadline)


def create_wsgi_app(service: Service) -> Flask:
    """A Flask app serving the shared route table over `service`."""
    app = Flask("twinserve")
    app.url_map.converters["model"] = _ModelNameConverter

    body_rule = service.body  # what the repository API's body is judged by, as an inference body is

    def request_head(exchange: Exchange, model: str, version: str | None = None) -> RequestHead:
        """The head admission reads, from Flask's request, once."""
        headers = request.headers
        endpoint = exchange.endpoint
        return RequestHead(
            endpoint,
            model,
            version,
            request.content_type,
            request.content_length,
            headers.get("Content-Encoding"),
            headers.get(TIMEOUT_HEADER),
            headers.get(PRIORITY_HEADER),
            headers.get(HEADER_LENGTH) if endpoint == "infer" else None,  # V2's binary data
            headers,  # a traffic split's sticky key
            request.environ.get(BACKLOG_ENVIRON),
            request.environ.get(DECIDED),  # the server's poller decided it from its head (servers/sync/admission.py)
        )

    def infer(model: str, version: str | None = None) -> Response:
        """V1 `:predict` and V2 `/infer` alike: the exchange's codec is the endpoint's."""
        exchange = _exchange()
        return _respond(drive.infer(exchange, request_head(exchange, model, version), request, _read_body, _predict))

    def stream(model: str) -> Response:
        """`:stream`: up to its first step in the driver (service/drive.py), the rest written by `WsgiEventStream`."""
        exchange = _exchange()
        start = drive.streamed(exchange, request_head(exchange, model), request, _read_body)
        g.streaming = True  # the exchange closes when the stream ends, not when the response starts
        body = WsgiEventStream(exchange, start)
        return Response(body, status=200, content_type=EVENT_STREAM, headers=SSE_HEADERS)

    def websocket(model: str) -> Response:
        raise WebSocketUnsupported(
            f"WebSocket streams need an event loop: serve with --arch async or --arch hybrid ({request.path})"
        )

    def model_route(handler: Callable[[str, str | None], Reply]) -> Callable[..., Response]:
        return lambda model, version=None: _respond(handler(model, version))

    views: dict[str, Callable[..., Response]] = {
        "alive": lambda: _respond(service.alive()),
        "list_models": lambda: _respond(service.list_models()),
        "model_metadata": lambda model: _respond(service.model_metadata(model)),
        "predict": infer,
        "stream": stream,
        "websocket": websocket,
        "live": lambda: _respond(service.live()),
        "ready": lambda: _respond(service.ready()),
        "server_metadata": lambda: _respond(service.server_metadata()),
        "v2_model_metadata": model_route(service.v2_model_metadata),
        "model_ready": model_route(service.model_ready),
        "infer": infer,
        "model_config": model_route(service.model_config),
        "model_stats": lambda model=None, version=None: _respond(service.model_stats(model, version)),
        "repository_index": lambda: _respond(service.repository.index()),
        # A load or unload runs in this request's thread: other requests go on in theirs.
        "repository_load": lambda model: _respond(service.repository.load(_exchange().key_id, model)),
        "repository_unload": lambda model: _respond(service.repository.unload(_exchange().key_id, model)),
        "repository_traffic": lambda model: _respond(service.repository.traffic(model)),
        "repository_set_traffic": lambda model: _respond(
            service.repository.set_traffic(_exchange().key_id, model, _read_body(request, body_rule))
        ),
        "openapi": lambda: _respond(service.openapi()),
        "docs": lambda: _respond(service.docs()),
        "docs_css": lambda: _respond(service.docs_asset("docs_css")),
        "docs_js": lambda: _respond(service.docs_asset("docs_js")),
        "metrics": lambda: _respond(service.metrics()),
    }
    for route in ROUTES:
        rule = route.path.replace("{model}", "<model:model>").replace("{version}", "<model:version>")
        app.add_url_rule(
            rule,
            endpoint=route.name,
            view_func=views[route.name],
            methods=[route.method],
            provide_automatic_options=False,
        )
        if route.name == "websocket":
            # Werkzeug routes a request with `Upgrade: websocket` to websocket rules only (else a 400): the 501
            # must answer both kinds.
            app.add_url_rule(
                rule, endpoint=route.name, methods=[route.method], websocket=True, provide_automatic_options=False
            )

    def _exchange() -> Exchange:
        exchange: Exchange | None = g.get("exchange")
        if exchange is None:  # the routing outcome is known before before_request runs
            rule = request.url_rule
            exchange = g.exchange = Exchange.open(
                service,
                rule.endpoint if rule is not None else "unknown",
                request.method,
                request.path,
                request.headers,
                request.headers.get(REQUEST_ID_HEADER),
                model=(request.view_args or {}).get("model", ""),
                shape=error_shape(request.path),
            )
        return exchange

    @app.before_request
    def _start() -> Response | None:
        exchange = _exchange()
        if service.checks_host:
            service.check_host(request.headers.get("host"))
        if service.cors is not None and service.is_preflight(request.method, request.headers):
            exchange.endpoint = "preflight"
            return _respond(exchange.reply(service.preflight(request.headers)))
        exchange.authenticate(request.headers, request.remote_addr)  # REMOTE_ADDR: gunicorn's peer address
        return None

    @app.after_request
    def _finish(response: Response) -> Response:
        exchange = _exchange()
        response.headers[REQUEST_ID_HEADER] = exchange.request_id
        # A request naming a foreign host gets nothing but its 400: no CORS grant either (as from the ASGI front).
        if service.cors is not None and exchange.endpoint != "preflight" and exchange.error_code != _HOST_REFUSED:
            cors = dict(service.cors.response_headers(request.headers.get("origin")))
            vary = cors.pop("Vary", None)
            if vary is not None:
                response.headers["Vary"] = merge_vary(response.headers.get("Vary"), vary)
            response.headers.update(cors)
        if not g.get("streaming"):
            exchange.responded(response.status_code)
            exchange.close()
        return response

    @app.teardown_request
    def _done(exc: BaseException | None) -> None:
        exchange: Exchange | None = g.get("exchange")
        if exchange is not None and not g.get("streaming"):
            exchange.close()  # a no-op once after_request has closed it

    def _error(error: BaseException) -> Response:
        return _respond(_exchange().fail(error))

    @app.errorhandler(TwinserveError)
    def _twinserve_error(exc: TwinserveError) -> Response:
        return _error(exc)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        return _error(_translate(exc, service))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        return _error(exc)  # logged with its traceback, answered as a bare 500

    return app
