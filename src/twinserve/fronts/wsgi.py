"""The sync front: a Flask WSGI app; each request runs start to end in the thread that received it (S1, S3)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter

from twinserve.core.admission import TIMEOUT_HEADER
from twinserve.errors import ClientError, MethodNotAllowed, NotFound, QueueFull, RequestTimeout, TwinserveError
from twinserve.fronts.contract import Reply, Service, error_reply
from twinserve.fronts.routes import JSON, MODEL_NAME_PATTERN, REQUEST_ID_HEADER, ROUTES, is_v2
from twinserve.observability.context import RequestContext
from twinserve.observability.metrics import metrics
from twinserve.protocol.v2 import HEADER_LENGTH

__all__ = ["BACKLOG_ENVIRON", "create_wsgi_app"]

#: Set by the server (gunicorn's gthread worker): requests still waiting for a request thread behind this one.
BACKLOG_ENVIRON = "twinserve.backlog"

logger = logging.getLogger("twinserve.wsgi")


class _ModelNameConverter(BaseConverter):
    regex = MODEL_NAME_PATTERN


def _respond(reply: Reply) -> Response:
    return Response(reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers)


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


def _read_body(service: Service) -> bytes:
    """The request body, refusing (413) one byte past the limit, chunked or not; 408 if the client stalls."""
    try:
        if request.content_length is not None:  # already checked against the limit by Service.admit
            body: bytes = request.get_data(cache=False)
            if len(body) < request.content_length:  # the client closed its side early: never act on half a message
                raise ClientError(
                    f"the request body ended after {len(body)} of the {request.content_length} bytes its "
                    "Content-Length announced",
                    headers={"Connection": "close"},
                )
            return body
        # Chunked: the server de-chunks wsgi.input and marks its end (wsgi.input_terminated).
        body = request.environ["wsgi.input"].read(service.max_body_bytes + 1)
    except TimeoutError:  # the server's socket read timeout (--read-timeout-s)
        raise RequestTimeout(
            f"the request body did not arrive within {service.config.read_timeout_s:g} s (--read-timeout-s)",
            headers={"Connection": "close"},
        ) from None
    if len(body) > service.max_body_bytes:
        raise service.too_large()
    return body


def _shed_if_backlogged(service: Service) -> None:
    """503 when more requests wait for a request thread than the queue bound allows (see SheddingThreadWorker)."""
    backlog: int | None = request.environ.get(BACKLOG_ENVIRON)
    bound = service.config.max_queue
    if backlog is not None and backlog > bound:
        raise QueueFull(
            f"{backlog} requests are waiting for a request thread (--max-queue {bound}); retry shortly",
            headers={"Retry-After": "1"},
        )


def create_wsgi_app(service: Service) -> Flask:
    """A Flask app serving the shared route table over `service`."""
    app = Flask("twinserve")
    app.url_map.converters["model"] = _ModelNameConverter

    def predict(model: str) -> Response:
        runtime = service.admit(model, request.content_type, request.content_length)
        _shed_if_backlogged(service)
        deadline = service.deadline(request.headers.get(TIMEOUT_HEADER))
        instances = runtime.codec.decode(_read_body(service))
        outputs = runtime.predict(instances, deadline)
        return Response(runtime.codec.encode(outputs, len(instances)), status=200, content_type=JSON)

    def infer(model: str, version: str | None = None) -> Response:
        runtime = service.admit_v2(model, version, request.content_type, request.content_length)
        _shed_if_backlogged(service)
        deadline = service.deadline(request.headers.get(TIMEOUT_HEADER))
        inference = runtime.v2.decode(_read_body(service), request.headers.get(HEADER_LENGTH))
        outputs = runtime.predict(inference.instances, service.v2_deadline(deadline, inference.timeout_us))
        return _respond(service.infer_reply(runtime, inference, outputs))

    def model_route(handler: Callable[[str, str | None], Reply]) -> Callable[..., Response]:
        return lambda model, version=None: _respond(handler(model, version))

    views: dict[str, Callable[..., Response]] = {
        "list_models": lambda: _respond(service.list_models()),
        "model_metadata": lambda model: _respond(service.model_metadata(model)),
        "predict": predict,
        "live": lambda: _respond(service.live()),
        "ready": lambda: _respond(service.ready()),
        "server_metadata": lambda: _respond(service.server_metadata()),
        "v2_model_metadata": model_route(service.v2_model_metadata),
        "model_ready": model_route(service.model_ready),
        "infer": infer,
        "model_config": model_route(service.model_config),
        "model_stats": lambda model=None, version=None: _respond(service.model_stats(model, version)),
        "openapi": lambda: _respond(service.openapi()),
        "docs": lambda: _respond(service.docs()),
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

    in_flight = metrics().in_flight

    def _context() -> RequestContext:
        context: RequestContext | None = g.get("context")
        if context is None:  # an error raised before before_request ran
            context = g.context = service.begin(
                request.headers.get(REQUEST_ID_HEADER), request.method, request.path, request.headers
            )
        return context

    @app.before_request
    def _start() -> None:
        _context()
        in_flight.inc()
        g.counted = True

    @app.after_request
    def _finish(response: Response) -> Response:
        context = _context()
        response.headers[REQUEST_ID_HEADER] = context.request_id
        rule = request.url_rule
        service.finish(
            context,
            rule.endpoint if rule is not None else "unknown",
            (request.view_args or {}).get("model", ""),
            response.status_code,
            g.get("error_code"),
        )
        return response

    @app.teardown_request
    def _done(exc: BaseException | None) -> None:
        if g.get("counted"):
            in_flight.dec()

    def _error(error: TwinserveError) -> Response:
        g.error_code = error.code
        return _respond(error_reply(error, _context().request_id, is_v2(request.path)))

    @app.errorhandler(TwinserveError)
    def _twinserve_error(exc: TwinserveError) -> Response:
        return _error(exc)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        return _error(_translate(exc, service))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _error(TwinserveError(f"internal error: {type(exc).__name__}"))

    return app
