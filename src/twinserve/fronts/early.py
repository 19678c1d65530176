"""Refusal before the app, for twinserve's sync worker (servers/sync/): a predict request for a model whose queue is
full, answered by the worker's poller from the request's head, byte for byte the app's answer, without a thread.

`EarlyRefusal.verdict` decides with the app's own objects (the route table, the runtime, the priority rule,
`ModelRuntime.refuse_early`); a request it lets in carries its `Decided` (service/lifecycle.py) to the app in the
WSGI environ, and the exchange takes it as made. It refuses only where its answer is the one the app would give:
never with API keys or CORS on, nor for a chunked, oversized or `Expect: 100-continue` body, a bad `X-Priority`, or
a model whose version is drawn per request (a traffic split); the app answers those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from twinserve.errors import QueueFull, TwinserveError
from twinserve.fronts.dispatch import ROUTE_ERRORS, Dispatcher
from twinserve.service.compression import GZIP_MIN_BYTES, compress_reply
from twinserve.service.contract import Service, request_id_from
from twinserve.service.lifecycle import Decided, RequestHead, admit_head
from twinserve.service.reply import Reply, error_reply
from twinserve.service.response import http1_response
from twinserve.service.routes import REQUEST_ID_HEADER, ROUTES, error_shape

__all__ = ["EarlyRefusal", "Head", "Refusal"]

_ENDPOINTS = frozenset({"predict", "infer"})
_PREFIXES = (b"/v1/models/", b"/v2/models/")
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode("latin-1")
#: How many paths' routes, and answers' bytes, `EarlyRefusal` keeps (distinct paths are the client's choice).
_ROUTES_KEPT = 512
_ANSWERS_KEPT = 64
#: Where a rendered answer's request id goes: as long as twinserve's own ids, of a character no id has.
_ID = "~" * len(request_id_from(None))
_ID_BYTES = _ID.encode()
#: The request headers the decision reads.
_READ = frozenset(
    {b"content-length", b"transfer-encoding", b"expect", b"x-priority", _REQUEST_ID, b"accept-encoding", b"host"}
)


class EarlyRefusal:
    """Whether a request's head alone earns it the app's 503 `queue_full`, and that answer's bytes."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.match = Dispatcher((route, route.name) for route in ROUTES).match
        #: False where the app must see every request first (API keys, CORS: see the module doc).
        self.active = service.auth is None and service.cors is None
        self._hosts = service.hosts if service.checks_host else None
        self._max_body = service.max_body_bytes
        #: Each path asked about -> its inference route (endpoint, model, version), None for any other: a flood
        #: asks about a handful of paths thousands of times a second (`_ROUTES_KEPT` at most: past it, anew).
        self._routes: dict[str, tuple[str, str, str | None] | None] = {}
        #: The answer's bytes after the server's own headers, per (error, shape, keep-alive), with `_ID` where the
        #: request id goes; and the server's headers rendered, for the list they were rendered from (uvicorn makes
        #: a new one when its `date` changes, once a second).
        self._answers: dict[tuple[Any, ...], bytes] = {}
        self._defaults: tuple[list[tuple[bytes, bytes]], bytes] = ([], b"")

    def answer(self, refusal: Refusal, default_headers: list[tuple[bytes, bytes]], keep_alive: bool) -> bytes:
        """The whole response (status line to body) of a `refusal`, for an HTTP server that parses bytes
        (servers/asgi/): `default_headers` are the server's own (`date`, `server`), written first as the server
        writes them on every response; without `keep_alive` the answer says `connection: close`, as the server's
        would."""
        answer = self._rendered(refusal, default_headers, keep_alive)
        if answer is None:
            reply, request_id = refusal.reply()
            answer = _response(reply, request_id, default_headers, keep_alive)
        return answer

    def _rendered(self, refusal: Refusal, default_headers: list[tuple[bytes, bytes]], keep_alive: bool) -> bytes | None:
        """`_response`'s bytes from the ones rendered for the same error (the request id and the server's headers
        put in); None where they may differ in more than those: a client's request id of another length than
        twinserve's own (the body's length changes), details, a body that could be gzipped."""
        error, head = refusal.error, refusal.head
        request_id = request_id_from(head.request_id)
        if len(request_id) != len(_ID) or error.details is not None or "~" in error.message:
            return None
        shape = error_shape(head.path)
        key = (error.status, error.code, error.message, shape, keep_alive, *(error.headers or {}).items())
        answer = self._answers.get(key)
        if answer is None:
            reply = error_reply(error, _ID, shape)
            if len(reply.body) >= GZIP_MIN_BYTES:
                return None  # long enough for compress_reply to consider: gzipped or not is the client's choice
            if len(self._answers) >= _ANSWERS_KEPT:
                self._answers.clear()
            answer = self._answers[key] = _response(reply, _ID, [], keep_alive)
        rendered_from, rendered = self._defaults
        if default_headers is not rendered_from:
            rendered = b"".join(name + b": " + value + b"\r\n" for name, value in default_headers)
            self._defaults = (default_headers, rendered)
        status_line = answer.index(b"\r\n") + 2
        return answer[:status_line] + rendered + answer[status_line:].replace(_ID_BYTES, request_id.encode())

    def verdict(
        self,
        method: bytes,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        backlog: int | None = None,
        spent: float = 0.0,
    ) -> Refusal | Decided | None:
        """The decision on a request from its parsed head (`headers` with lower-cased names): its `Refusal`, its
        `Decided` (let in: the app takes it as made), or None (not decided here: the app decides); `backlog`: the
        requests waiting for a request thread ahead of it (the sync front's poller, None elsewhere), `spent`: the
        seconds the poller held it already."""
        if method != b"POST" or not url.startswith(_PREFIXES) or not (spent or self.crowded(backlog)):
            return None  # the common case, decided on bytes and a few counters
        fields = {name: value for name, value in headers if name in _READ}
        if b"transfer-encoding" in fields or b"expect" in fields or not self._small(fields.get(b"content-length")):
            return None
        priority, request_id = _text(fields, b"x-priority"), _text(fields, _REQUEST_ID)
        head = Head(_path(url), priority, request_id, _text(fields, b"accept-encoding"))
        return self.decide(head, _text(fields, b"host"), backlog, spent)

    @staticmethod
    def inference(method: bytes, url: bytes) -> bool:
        """Whether a request line is for an inference route (POST under /v1/models/ or /v2/models/): what may be
        refused or held before the app. A probe, a scrape or a model's metadata never waits behind a crowd."""
        return method == b"POST" and url.startswith(_PREFIXES)

    def crowded(self, backlog: int | None = None) -> bool:
        """Whether any model's queue may refuse a request now (`ModelRuntime.crowded`), or the sync request threads'
        `backlog` is past what the lowest level may have waiting: what every predict request pays when nothing is
        refused. Default versions only: a request for another version whose queue alone is full goes to the app,
        which refuses it there."""
        if backlog is not None and self.service.admission.backlog_crowded(backlog):
            return True
        return any(runtime.crowded for runtime in self.service.runtimes.values())

    def _small(self, length: str | bytes | None) -> bool:
        """Whether a body of `length` (a Content-Length, None: no body) may be discarded: not past the limit."""
        return length is None or (length.isdigit() and int(length) <= self._max_body)

    def decide(
        self, head: Head, host: str | None, backlog: int | None = None, spent: float = 0.0
    ) -> Refusal | Decided | None:
        """The app's decision from the head, the app's own (service/lifecycle.py `admit_head`, which
        `Exchange.admit` calls where nothing was decided here): the request's level from `X-Priority`, the sync
        backlog (`backlog`, None for none), the model, its default level; then its batch queue. A `Refusal` where
        that decision is 503 `queue_full`, a `Decided` where the request passes it; None where anything else
        decides (a 400, a 404, a model not ready): the app's, as always."""
        if self._hosts is not None and not self._hosts.allows_host(host):
            return None  # the app refuses a foreign Host first (400)
        route = self._route(head.path)
        if route is None:
            return None
        endpoint, model, asked_version = route
        service = self.service
        version = None
        if asked_version is None and model in service.registry.traffic:
            return None  # a traffic split picks the version per request (sticky, weighted): the app's to route
        level = _Level()
        try:
            request = RequestHead(endpoint, model, asked_version, priority=head.priority, backlog=backlog)
            runtime, shadow = admit_head(service, request, None, level, spent)  # no key: keys on decide nothing here
            if not runtime.ready:
                return None
            model, version = runtime.name, runtime.spec.version
            error: TwinserveError | None = runtime.early_refusal(level.priority)
        except QueueFull as full:  # the sync backlog's
            error = full
        except TwinserveError:
            return None  # a 400, 404 or 503 of another kind: the app's to answer, as always
        if error is None:
            return Decided(level.priority, runtime, shadow)
        if model not in service.runtimes:
            return None  # shed before the model was known, and it is unknown: the app counts it without a label
        service.refused_early(model, version, endpoint, level.priority, error.status, error.code)
        return Refusal(error, head)

    def _route(self, path: str) -> tuple[str, str, str | None] | None:
        """The inference route `path` asks for with POST (endpoint, model, version or None), else None."""
        try:
            return self._routes[path]
        except KeyError:
            pass
        route: tuple[str, str, str | None] | None = None
        try:
            endpoint, params = self.match("POST", path)
        except ROUTE_ERRORS:
            pass
        else:
            if endpoint in _ENDPOINTS:
                route = (endpoint, params["model"], params.get("version"))
        if len(self._routes) >= _ROUTES_KEPT:
            self._routes.clear()
        self._routes[path] = route
        return route


def _path(url: bytes) -> str:
    """A request target's path, unquoted."""
    path = url.split(b"?", 1)[0].decode("latin-1")
    return unquote(path) if "%" in path else path


def _text(fields: dict[bytes, bytes], name: bytes) -> str | None:
    value = fields.get(name)
    return None if value is None else value.decode("latin-1")


class _Level:
    """Where `admit_head` writes the refused request's level (the app writes it to the request's context)."""

    __slots__ = ("priority",)

    def __init__(self) -> None:
        self.priority = 1


@dataclass(frozen=True, slots=True)
class Head:
    """What the decision reads from a request's head: its path (unquoted), `X-Priority`, `X-Request-ID`,
    `Accept-Encoding`."""

    path: str
    priority: str | None
    request_id: str | None
    accept_encoding: str | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused before the app: its error, and what the answer's rendering reads from the request."""

    error: TwinserveError
    head: Head

    def reply(self) -> tuple[Reply, str]:
        """The app's reply (its body in the path's error shape, compressed as the app would) and request id."""
        head = self.head
        request_id = request_id_from(head.request_id)
        reply = error_reply(self.error, request_id, error_shape(head.path))
        return compress_reply(reply, head.accept_encoding), request_id


def _response(reply: Reply, request_id: str, default_headers: list[tuple[bytes, bytes]], keep_alive: bool) -> bytes:
    """The app's answer as uvicorn writes it: its status line and own headers, then the app's head by the one
    response writer the app's replies go through (service/response.py)."""
    return http1_response(reply, request_id, default_headers, close=not keep_alive)
