"""One exception hierarchy; each error carries the HTTP status it maps to.

    TwinserveError                      500 internal
    ├── ConfigError                     (start-up only; never reaches a client)
    │   └── MissingExtra                (a feature whose optional dependencies are not installed)
    ├── ModelImportError                (start-up only; never reaches a client)
    ├── ModelFileError                  (start-up only: a model file that twinserve.loading cannot load)
    │   └── UntrustedModelFile          (it would run code, or rebuild types nobody trusted)
    ├── ClientError                     4xx
    │   ├── MalformedRequest            400 malformed_json / bad_request
    │   ├── MalformedHttp               400 malformed_http (answered by the HTTP server)
    │   ├── HostNotAllowed              400 host_not_allowed (--allowed-hosts)
    │   ├── Unauthorized                401 unauthorized (WWW-Authenticate: Bearer)
    │   ├── CorsRejected                403 cors_rejected (a preflight from an origin, method or header not allowed)
    │   ├── Forbidden                   403 forbidden (a repository change asked with a key that is not the admin's)
    │   ├── CrossSite                   403 cross_site (a page on another site sent a state-changing request)
    │   ├── InvalidTensor               400 invalid_tensor (V2: unknown tensor, wrong shape or datatype)
    │   ├── NotStreaming                400 not_streaming (`:stream` on a model whose predict is not a generator)
    │   ├── ModelControlOff             400 model_control_off (load/unload without --model-control explicit)
    │   ├── NotFound                    404 not_found
    │   │   └── ModelNotFound           404 model_not_found
    │   ├── MethodNotAllowed            405 method_not_allowed
    │   ├── RequestTimeout              408 request_timeout (the body did not arrive within --read-timeout-s)
    │   ├── PayloadTooLarge             413 payload_too_large
    │   │   ├── TooManyInstances        413 too_many_instances (--max-instances)
    │   │   └── TooManyElements         413 too_many_elements (--max-tensor-elements)
    │   ├── UriTooLong                  414 uri_too_long (--max-request-line; answered by the HTTP server)
    │   ├── UnsupportedMediaType        415 unsupported_media_type
    │   ├── ValidationFailed            422 validation_failed
    │   ├── UpgradeRequired             426 upgrade_required (a WebSocket route asked for without the upgrade)
    │   ├── RateLimited                 429 rate_limited (Retry-After)
    │   ├── HeadersTooLarge             431 headers_too_large (answered by the HTTP server)
    │   └── ClientDisconnected          499 client_disconnected (logged; nobody is left to read it)
    └── ServerError                     5xx
        ├── ModelFailed                 500 model_error
        ├── OutputMismatch              500 output_mismatch
        ├── ModelNotReady               503 model_not_ready (Retry-After)
        ├── ModelUnavailable            503 model_unavailable (a repository model that failed to import or load)
        ├── QueueFull                   503 queue_full (Retry-After)
        ├── WorkerDied                  503 worker_died
        ├── TooManyPending              503 too_many_pending (a WebSocket's unanswered messages at their bound)
        ├── ShuttingDown                503 shutting_down (a WebSocket message sent while the server drains)
        ├── WebSocketUnsupported        501 websocket_unsupported (the sync architecture)
        ├── DependencyUnavailable       503 dependency_unavailable (Retry-After; a store the model needs is down)
        └── DeadlineExceeded            504 deadline_exceeded
            └── DeadlineUnmeetable      504 deadline_unmeetable (refused at once: the queue ahead outlasts it)

Fronts never choose a status themselves: they raise (or catch) one of these and render it with
`error_payload`, so every architecture answers the same status and body for the same fault.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

__all__ = [
    "ClientDisconnected",
    "ClientError",
    "ConfigError",
    "CorsRejected",
    "CrossSite",
    "DeadlineExceeded",
    "DeadlineUnmeetable",
    "DependencyUnavailable",
    "Forbidden",
    "HeadersTooLarge",
    "HostNotAllowed",
    "InvalidTensor",
    "MalformedHttp",
    "MalformedRequest",
    "MethodNotAllowed",
    "MissingExtra",
    "ModelControlOff",
    "ModelFailed",
    "ModelFileError",
    "ModelImportError",
    "ModelNotFound",
    "ModelNotReady",
    "ModelUnavailable",
    "NotFound",
    "NotStreaming",
    "OutputMismatch",
    "PayloadTooLarge",
    "QueueFull",
    "RateLimited",
    "RequestTimeout",
    "ServerError",
    "ShuttingDown",
    "TooManyElements",
    "TooManyInstances",
    "TooManyPending",
    "TwinserveError",
    "Unauthorized",
    "UnsupportedMediaType",
    "UntrustedModelFile",
    "UpgradeRequired",
    "UriTooLong",
    "ValidationFailed",
    "WebSocketUnsupported",
    "WorkerDied",
    "error_from_code",
    "error_payload",
    "internal_error",
    "v1_error_payload",
]


class TwinserveError(Exception):
    """Base of every error twinserve raises on purpose.

    `message` is what the client reads. `private` is what only the server log holds: a model's exception text,
    which may carry secrets (a connection string) or, in a shared batch, another client's input. It reaches a
    client only with `--expose-errors`, and then only the client whose request was computed alone
    (`service/exchange.py`).
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    headers: dict[str, str]

    def __init__(
        self,
        message: str,
        *,
        details: Any = None,
        headers: dict[str, str] | None = None,
        private: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}
        self.private = private

    def exposed(self) -> TwinserveError:
        """This error with its private text in the message (`--expose-errors`); itself when it has none."""
        if self.private is None:
            return self
        error = copy.copy(self)
        error.message, error.private = f"{self.message}: {self.private}", None
        return error


class ConfigError(TwinserveError):
    """An invalid setting, reported in one line before any port is bound."""

    code = "config"


class MissingExtra(ConfigError):
    """A feature needs an optional extra that is not installed; the message names the pip command."""

    code = "missing_extra"

    def __init__(self, what: str, extra: str, needs: str | None = None) -> None:
        super().__init__(f"{what} needs {needs or f'the {extra!r} extra'}: pip install 'twinserve[{extra}]'")
        self.extra = extra


class ModelImportError(TwinserveError):
    """MODEL could not be imported or is not a model class."""

    code = "model_import"


class ModelFileError(TwinserveError):
    """A model file is missing, corrupt or of the wrong format (`twinserve.loading`)."""

    code = "model_file"


class UntrustedModelFile(ModelFileError):
    """Loading a model file would run its code (a pickle without --trust-pickle) or rebuild untrusted types."""

    code = "untrusted_model_file"


class ClientError(TwinserveError):
    status = 400
    code = "bad_request"


class MalformedRequest(ClientError):
    status = 400
    code = "malformed_json"


class MalformedHttp(ClientError):
    """Refused by the HTTP server while it parses, before or while the body is read; the connection closes.

    A request line, header or body framing (Content-Length, Transfer-Encoding, a chunk) that is not valid
    HTTP/1.1: where the next request on the connection would start is unknown, so there is none.
    """

    status = 400
    code = "malformed_http"

    DEFAULT = "the request is not valid HTTP/1.1 (its request line, a header or the body's framing)"

    def __init__(self, message: str = DEFAULT, *, private: str | None = None) -> None:
        super().__init__(message, headers={"Connection": "close"}, private=private)


class InvalidTensor(ClientError):
    """A V2 inference request whose tensors do not match the model's: unknown name, wrong shape or datatype."""

    status = 400
    code = "invalid_tensor"


class NotStreaming(ClientError):
    """`:stream` asked of a model whose predict returns its outputs at once (not a generator)."""

    status = 400
    code = "not_streaming"


class HostNotAllowed(ClientError):
    """The request's Host names a host the server does not answer to: a DNS-rebinding page, say."""

    status = 400
    code = "host_not_allowed"


class Unauthorized(ClientError):
    """No API key, or one the server does not know (only when API keys are configured)."""

    status = 401
    code = "unauthorized"


class CorsRejected(ClientError):
    """A CORS preflight from an origin, or for a method or header, the server does not allow."""

    status = 403
    code = "cors_rejected"


class CrossSite(ClientError):
    """A request a page on another site sent without a preflight (a form, or a `no-cors` fetch) to a route that
    changes the server's state, or a form-typed predict from one: its `Origin` is neither the server's nor one
    `--cors-origins` allows, or `Sec-Fetch-Site` says cross-site."""

    status = 403
    code = "cross_site"


class ModelControlOff(ClientError):
    """A repository load or unload asked of a server that does not take them (`--model-control none`)."""

    code = "model_control_off"


class Forbidden(ClientError):
    """A valid API key that may not do this: a model-repository change needs the admin key (`--admin-api-key`)."""

    status = 403
    code = "forbidden"


class NotFound(ClientError):
    status = 404
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(ClientError):
    status = 405
    code = "method_not_allowed"


class RequestTimeout(ClientError):
    """The client stopped sending its request body (slowloris): the connection is closed after this answer."""

    status = 408
    code = "request_timeout"


class PayloadTooLarge(ClientError):
    status = 413
    code = "payload_too_large"


class TooManyInstances(PayloadTooLarge):
    code = "too_many_instances"


class TooManyElements(PayloadTooLarge):
    code = "too_many_elements"


class UriTooLong(ClientError):
    """Refused by the HTTP server while it parses, before any front sees the request."""

    status = 414
    code = "uri_too_long"

    def __init__(self, message: str = "the request line is longer than the server accepts (--max-request-line)"):
        super().__init__(message)


class UnsupportedMediaType(ClientError):
    status = 415
    code = "unsupported_media_type"


class ValidationFailed(ClientError):
    status = 422
    code = "validation_failed"


class UpgradeRequired(ClientError):
    """A plain GET on a WebSocket route."""

    status = 426
    code = "upgrade_required"


class RateLimited(ClientError):
    status = 429
    code = "rate_limited"


class HeadersTooLarge(ClientError):
    """Refused by the HTTP server while it parses, before any front sees the request."""

    status = 431
    code = "headers_too_large"

    DEFAULT = "the request has too many header fields or one too long (--max-header-count, --max-header-bytes)"

    def __init__(self, message: str = DEFAULT):
        super().__init__(message)


class ClientDisconnected(ClientError):
    status = 499
    code = "client_disconnected"


class ServerError(TwinserveError):
    status = 500
    code = "internal"


class ModelFailed(ServerError):
    """The model's own code raised."""

    code = "model_error"


class OutputMismatch(ServerError):
    """`predict` returned a different number of outputs than it was given inputs."""

    code = "output_mismatch"


class ModelNotReady(ServerError):
    """The model has not finished loading (the server answers while its models load): retry after a moment."""

    status = 503
    code = "model_not_ready"


class ModelUnavailable(ServerError):
    """A model of the repository that failed to import or load (the repository index has the reason), or that was
    unloaded; the other models keep serving."""

    status = 503
    code = "model_unavailable"


class QueueFull(ServerError):
    """Admission control: the queue of waiting instances is at its bound (`--max-queue`)."""

    status = 503
    code = "queue_full"


class WorkerDied(ServerError):
    """The model-worker process computing this request died; the pool replaces it."""

    status = 503
    code = "worker_died"


class TooManyPending(ServerError):
    """A WebSocket already has `--ws-max-pending` messages unanswered; this one is refused, not queued."""

    status = 503
    code = "too_many_pending"


class ShuttingDown(ServerError):
    """The server is draining its WebSockets to stop: messages that arrive meanwhile are refused."""

    status = 503
    code = "shutting_down"


class WebSocketUnsupported(ServerError):
    """The sync architecture (WSGI) cannot hold WebSockets."""

    status = 501
    code = "websocket_unsupported"


class DependencyUnavailable(ServerError):
    """A service the model needs (a feature store, say) cannot be reached; the message names it."""

    status = 503
    code = "dependency_unavailable"

    def __init__(self, message: str, *, details: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, details=details, headers={"Retry-After": "1", **(headers or {})})


class DeadlineExceeded(ServerError):
    """The request's deadline passed before its result was ready; queued requests are never computed."""

    status = 504
    code = "deadline_exceeded"


class DeadlineUnmeetable(DeadlineExceeded):
    """Refused on arrival: the work queued ahead of the request would take longer than its deadline leaves, so
    waiting could only end in `deadline_exceeded` (the estimate is the measured batch time x the batches ahead)."""

    code = "deadline_unmeetable"


def _descendants(cls: type[TwinserveError]) -> list[type[TwinserveError]]:
    return [cls, *(d for sub in cls.__subclasses__() for d in _descendants(sub))]


def internal_error(exc: BaseException) -> TwinserveError:
    """A 500 for an exception twinserve did not expect: its type only (the traceback is logged, never sent)."""
    return TwinserveError(f"internal error: {type(exc).__name__}")


def error_from_code(code: str, message: str, private: str | None = None) -> TwinserveError:
    """Rebuild an error sent as (code, message, private text) across a process boundary."""
    for cls in _descendants(TwinserveError):
        if cls.code == code:
            return cls(message, private=private)
    return ModelFailed(message, private=private)


def v1_error_payload(error: TwinserveError, request_id: str) -> dict[str, Any]:
    """The JSON body of an error on a V1 route: `{"error": "message", "code", "request_id"[, "details"]}`.

    TF-Serving's REST API answers `{"error": "<message>"}` and KServe's V1 clients read `error` as the message
    string; twinserve's code and request id stand beside it."""
    body: dict[str, Any] = {"error": error.message, "code": error.code, "request_id": request_id}
    if error.details is not None:
        body["details"] = error.details
    return body


def error_payload(error: TwinserveError, request_id: str) -> dict[str, Any]:
    """The JSON body of an error response: `{"error": {"code", "message", "request_id"[, "details"]}}`."""
    body: dict[str, Any] = {"code": error.code, "message": error.message, "request_id": request_id}
    if error.details is not None:
        body["details"] = error.details
    return {"error": body}
