"""The sync front: a Flask WSGI app; each request runs start to end in the thread that received it (S1, S3).

`:stream` answers with the same Server-Sent Events as the async front, sent with chunked transfer encoding: the
model's generator is stepped in the request thread as each event is written, and closed when a write fails
because the client has gone (gunicorn then closes the response iterable).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter

from twinserve.core.admission import TIMEOUT_HEADER
from twinserve.core.runtime import ModelRuntime
from twinserve.core.streams import Steps
from twinserve.errors import (
    ClientDisconnected,
    ClientError,
    MethodNotAllowed,
    NotFound,
    QueueFull,
    RequestTimeout,
    TwinserveError,
    WebSocketUnsupported,
    internal_error,
)
from twinserve.fronts.contract import (
    EVENT_STREAM,
    SSE_END,
    SSE_HEADERS,
    Reply,
    Service,
    error_reply,
    sse_error,
    sse_step,
)
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


class _EventStream:
    """The response body of one stream: SSE events written as the steps come; `close()` (always called by the
    WSGI server, even if the body was never iterated) closes the generator and counts the request once."""

    def __init__(
        self,
        service: Service,
        context: RequestContext,
        runtime: ModelRuntime,
        steps: Steps,
        first: list[Any] | None,
        expected: int,
    ) -> None:
        self.service, self.context, self.runtime, self.steps = service, context, runtime, steps
        self.first, self.expected = first, expected
        # Until the stream is seen to its end: a client that leaves first is counted as 499.
        self.status: int = ClientDisconnected.status
        self.error_code: str | None = ClientDisconnected.code
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            if self.first is not None:
                yield sse_step(self.runtime, self.first, self.expected)
                for step in self.steps:
                    yield sse_step(self.runtime, step, self.expected)
            self.status, self.error_code = 200, None
            last = SSE_END
        except TwinserveError as exc:
            self.status, self.error_code = exc.status, exc.code
            last = sse_error(exc, self.context.request_id)
        except Exception as exc:
            logger.exception("unhandled error in the stream of %s", _request_path(self.context))
            error = internal_error(exc)
            self.status, self.error_code = error.status, error.code
            last = sse_error(error, self.context.request_id)
        self.close()  # counted before the client can see the end
        yield last

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.steps.close()
        except TwinserveError:
            pass  # the model's finally raised: model_code logged it
        finally:
            if self.error_code == ClientDisconnected.code:
                logger.info("client left the stream of %s; its generator was closed", _request_path(self.context))
            self.service.finish(self.context, "stream", self.runtime.name, self.status, self.error_code)
            metrics().in_flight.dec()


def _request_path(context: RequestContext) -> str:
    return f"{context.method} {context.path} ({context.request_id})"


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
        _shed_if_backlogged(service)  # before admission, so shed requests take no rate-limit token
        runtime = service.admit(model, request.content_type, request.content_length)
        deadline = service.deadline(request.headers.get(TIMEOUT_HEADER))
        instances = runtime.codec.decode(_read_body(service))
        outputs = runtime.predict(instances, deadline)
        return Response(runtime.codec.encode(outputs, len(instances)), status=200, content_type=JSON)

    def stream(model: str) -> Response:
        _shed_if_backlogged(service)
        runtime = service.admit_stream(model, request.content_type, request.content_length)
        deadline = service.deadline(request.headers.get(TIMEOUT_HEADER))
        instances = runtime.codec.decode(_read_body(service))
        steps = runtime.stream(instances, deadline)
        try:
            # Errors up to the first step are answered like :predict's, with their status and JSON body.
            first = next(steps, None)
        except BaseException:
            steps.close()
            raise
        context = _context()
        service.first_chunk(context, runtime.name)
        g.streaming = True  # counted and logged when the stream ends, not when the response starts
        body = _EventStream(service, context, runtime, steps, first, len(instances))
        return Response(body, status=200, content_type=EVENT_STREAM, headers=SSE_HEADERS)

    def infer(model: str, version: str | None = None) -> Response:
        _shed_if_backlogged(service)
        runtime = service.admit_v2(model, version, request.content_type, request.content_length)
        deadline = service.deadline(request.headers.get(TIMEOUT_HEADER))
        inference = runtime.v2.decode(_read_body(service), request.headers.get(HEADER_LENGTH))
        outputs = runtime.predict(inference.instances, service.v2_deadline(deadline, inference.timeout_us))
        return _respond(service.infer_reply(runtime, inference, outputs))

    def websocket(model: str) -> Response:
        raise WebSocketUnsupported(
            f"WebSocket streams need an event loop: serve with --arch async or --arch hybrid ({request.path})"
        )

    def model_route(handler: Callable[[str, str | None], Reply]) -> Callable[..., Response]:
        return lambda model, version=None: _respond(handler(model, version))

    views: dict[str, Callable[..., Response]] = {
        "list_models": lambda: _respond(service.list_models()),
        "model_metadata": lambda model: _respond(service.model_metadata(model)),
        "predict": predict,
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
        if route.name == "websocket":
            # Werkzeug routes a request with `Upgrade: websocket` to websocket rules only (else a 400): the 501
            # must answer both kinds.
            app.add_url_rule(
                rule, endpoint=route.name, methods=[route.method], websocket=True, provide_automatic_options=False
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
    def _start() -> Response | None:
        _context()
        in_flight.inc()
        g.counted = True
        if service.cors is not None and service.is_preflight(request.method, request.headers):
            g.endpoint = "preflight"
            return _respond(service.preflight(request.headers))
        if service.requires_auth(request.path):
            service.authenticate(request.headers)
        return None

    @app.after_request
    def _finish(response: Response) -> Response:
        context = _context()
        response.headers[REQUEST_ID_HEADER] = context.request_id
        if service.cors is not None and g.get("endpoint") != "preflight":
            response.headers.update(service.cors.response_headers(request.headers.get("origin")))
        if g.get("streaming"):
            return response  # counted when the stream ends
        rule = request.url_rule
        service.finish(
            context,
            g.get("endpoint") or (rule.endpoint if rule is not None else "unknown"),
            (request.view_args or {}).get("model", ""),
            response.status_code,
            g.get("error_code"),
        )
        return response

    @app.teardown_request
    def _done(exc: BaseException | None) -> None:
        if g.get("counted") and not g.get("streaming"):
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
        return _error(internal_error(exc))

    return app
