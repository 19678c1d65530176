"""Refusal before the app: a predict request for a model whose queue is full, answered by the HTTP server from
the request's head, without an ASGI task, a request context, a body read or a decode.

Under a flood most requests are refused; through the ASGI app each refusal costs a task, uvicorn's cycle, an
exchange and the front's Python, about as much as a small served request. twinserve's own httptools protocol
(servers/httptools.py) asks `EarlyRefusal.refuse` once a request's head is parsed, and when it answers, writes the
answer and discards the body; the app never sees the request. The app publishes the object in the ASGI lifespan
state (`EARLY_REFUSAL_STATE`), the one channel ASGI gives an app to its server.

The decision is the app's own, on the same objects: the route table's match (V1 `:predict`, V2 `/infer`, their
versioned forms), the same runtime lookup, the request's priority by the same rule (`X-Priority`, else the model's
default), and `ModelRuntime.refuse_early`, the check the exchange makes before it reads the body, over the same
`QueueBound` and the batch queue's counters (read without a lock, as the exchange reads them). The answer is the
app's answer, byte for byte apart from the request id and the `date`: `error_reply` renders the body and the
headers are written in the order the app's response writes them.

Refused early only where that answer is the one the app would give, and the body may be discarded cheaply; every
other request goes to the app unchanged, which decides as before:
- API keys on (the path needs a key): an unauthenticated client must meet 401 first and learn nothing of the
  load; checking a key here would copy the lockout and per-key rules, so with keys on nothing is refused early.
- CORS on: the app adds its headers to every answer. A `Host` the allowed hosts refuse is the app's (400).
- A body sent chunked, larger than `--max-body-bytes`, or behind `Expect: 100-continue` (the app answers those
  its own way: 413, or a body it never asked for), and an invalid `X-Priority` (400).
- A V2 request's `parameters.priority` is in its body, unknown before the body: the head's `X-Priority` (or the
  model's default) decides here, and the body's level may still be refused by the batch queue afterwards.
- The rate limit is not charged for a request refused early (as the sync backlog's refusal takes no token).
"""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import unquote

from twinserve.errors import QueueFull, TwinserveError
from twinserve.fronts.compression import compress_reply
from twinserve.fronts.contract import Service, request_id_from
from twinserve.fronts.dispatch import ROUTE_ERRORS, Dispatcher
from twinserve.fronts.exchange import error_reply
from twinserve.fronts.routes import REQUEST_ID_HEADER, ROUTES, ErrorShape, error_shape

__all__ = ["EARLY_REFUSAL_STATE", "EarlyRefusal"]

#: The key of the lifespan state under which the app publishes its `EarlyRefusal`.
EARLY_REFUSAL_STATE = "twinserve.early_refusal"
_ENDPOINTS = frozenset({"predict", "infer"})
_PREFIXES = (b"/v1/models/", b"/v2/models/")
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode("latin-1")


class EarlyRefusal:
    """Whether a request's head alone earns it the app's 503 `queue_full`, and that answer's bytes."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.match = Dispatcher((route, route.name) for route in ROUTES).match
        #: False where the app must see every request first (API keys, CORS: see the module doc).
        self.active = service.auth is None and service.cors is None
        self._hosts = service.hosts if service.checks_host else None
        self._max_body = service.max_body_bytes

    def refuse(
        self,
        method: bytes,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        default_headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> bytes | None:
        """The whole response (status line to body) when the request is refused, else None: the app takes it.

        `headers` are the request's, names lower-cased (as uvicorn keeps them); `default_headers` the server's
        own (`date`, `server`), written first as the server writes them on every response; without `keep_alive`
        the answer says `connection: close`, as the server's would."""
        if method != b"POST" or not url.startswith(_PREFIXES):
            return None  # the common case, decided on bytes
        priority_header = request_id = accept_encoding = host = None
        for name, value in headers:
            if name == b"content-length":
                if not value.isdigit() or int(value) > self._max_body:
                    return None
            elif name in (b"transfer-encoding", b"expect"):
                return None
            elif name == b"x-priority":
                priority_header = value.decode("latin-1")
            elif name == _REQUEST_ID:
                request_id = value.decode("latin-1")
            elif name == b"accept-encoding":
                accept_encoding = value.decode("latin-1")
            elif name == b"host":
                host = value.decode("latin-1")
        if self._hosts is not None and not self._hosts.allows_host(host):
            return None  # the app refuses a foreign Host first (400)
        raw_path = url.split(b"?", 1)[0]
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        try:
            endpoint, params = self.match("POST", path)
        except ROUTE_ERRORS:
            return None
        if endpoint not in _ENDPOINTS:
            return None
        service = self.service
        try:
            runtime = service.runtime(params["model"], params.get("version"))
            if not runtime.ready:
                return None
            priority = service.admission.priority(priority_header, default=runtime.config.default_priority)
            runtime.refuse_early(priority)
        except QueueFull as full:
            error: TwinserveError = full
        except TwinserveError:
            return None  # a 400, 404 or 503 of another kind: the app's to answer, as always
        else:
            return None
        service.refused_early(runtime.name, runtime.spec.version, endpoint, priority, error.status, error.code)
        return _response(error, request_id, error_shape(path), accept_encoding, default_headers, keep_alive)


def _response(
    error: TwinserveError,
    request_id_header: str | None,
    shape: ErrorShape,
    accept_encoding: str | None,
    default_headers: list[tuple[bytes, bytes]],
    keep_alive: bool,
) -> bytes:
    """The app's error response as bytes: the server's status line and own headers, then the front's headers in
    the order its response writes them (request id, the error's, content-length, content-type)."""
    request_id = request_id_from(request_id_header)
    reply = compress_reply(error_reply(error, request_id, shape), accept_encoding)
    lines = [f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}\r\n".encode("latin-1")]
    lines += [name + b": " + value + b"\r\n" for name, value in default_headers]
    fields = {REQUEST_ID_HEADER: request_id, **(reply.headers or {})}
    lines += [f"{name.lower()}: {value}\r\n".encode("latin-1") for name, value in fields.items()]
    lines.append(f"content-length: {len(reply.body)}\r\ncontent-type: {reply.content_type}\r\n".encode("latin-1"))
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    lines.append(b"\r\n")
    lines.append(reply.body)
    return b"".join(lines)
