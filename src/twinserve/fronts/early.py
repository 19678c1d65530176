"""Refusal before the app, for twinserve's sync worker (servers/sync/): a predict request for a model whose queue is
full, answered by the worker's poller from the request's head, byte for byte the app's answer, without a thread.

`EarlyRefusal.verdict` decides with the app's own objects (the route table, the runtime, the priority rule,
`ModelRuntime.refuse_early`); a request it lets in carries its `Admitted` (service/admission.py) to the app in the
WSGI environ, and the exchange takes it as made. It refuses only where its answer is the one the app would give:
never with API keys or CORS on, nor for a chunked, oversized or `Expect: 100-continue` body, a bad `X-Priority`, or
a model whose version is drawn per request (a traffic split); the app answers those.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from twinserve.core.admission import TIMEOUT_HEADER
from twinserve.errors import QueueFull, RateLimited, TwinserveError
from twinserve.fronts.dispatch import ROUTE_ERRORS, Dispatcher
from twinserve.service.admission import Admitted, RequestHead, admit
from twinserve.service.compression import compress_reply
from twinserve.service.contract import Service, request_id_from
from twinserve.service.reply import Reply, error_reply
from twinserve.service.routes import REQUEST_ID_HEADER, ROUTES, error_shape

__all__ = ["EarlyRefusal", "Head", "Refusal"]

_ENDPOINTS = frozenset({"predict", "infer"})
_PREFIXES = (b"/v1/models/", b"/v2/models/")
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode("latin-1")
#: How many paths' routes `EarlyRefusal` keeps (distinct paths are the client's choice).
_ROUTES_KEPT = 512
#: The request headers the decision reads.
_TIMEOUT = TIMEOUT_HEADER.lower().encode("latin-1")
_READ = frozenset(
    {
        *(b"content-length", b"content-type", b"content-encoding", b"transfer-encoding", b"expect", b"host"),
        *(b"x-priority", _REQUEST_ID, _TIMEOUT, b"accept-encoding"),
    }
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

    def verdict(
        self,
        method: bytes,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        backlog: int | None = None,
        spent: float = 0.0,
    ) -> Refusal | Admitted | None:
        """The decision on a request from its parsed head (`headers` with lower-cased names): its `Refusal`, its
        what it admitted (let in: the app takes it as made), or None (not decided here: the app decides); `backlog`: the
        requests waiting for a request thread ahead of it (the sync front's poller, None elsewhere), `spent`: the
        seconds the poller held it already."""
        if method != b"POST" or not url.startswith(_PREFIXES) or not (spent or self.crowded(backlog)):
            return None  # the common case, decided on bytes and a few counters
        fields = {name: value for name, value in headers if name in _READ}
        if b"transfer-encoding" in fields or b"expect" in fields or not self._small(fields.get(b"content-length")):
            return None
        length = fields.get(b"content-length")
        head = Head(
            _path(url),
            _text(fields, b"x-priority"),
            _text(fields, _REQUEST_ID),
            _text(fields, b"accept-encoding"),
            _text(fields, b"content-type"),
            None if length is None else int(length),
            _text(fields, b"content-encoding"),
            _text(fields, _TIMEOUT),
        )
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
    ) -> Refusal | Admitted | None:
        """The app's one admission decision (service/admission.py `admit`), made here instead of the app: a
        `Refusal` where it refuses for the load (the queue or the backlog full, the rate limit), what it admitted
        where it lets the request in (the app takes it as made); None where anything else decides (a 400, a 404, a
        model still loading, which the app waits for): the app's, which decides anew (nothing was charged)."""
        if self._hosts is not None and not self._hosts.allows_host(host):
            return None  # the app refuses a foreign Host first (400)
        route = self._route(head.path)
        if route is None:
            return None
        endpoint, model, asked_version = route
        service = self.service
        if asked_version is None and model in service.registry.traffic:
            return None  # a traffic split picks the version per request (sticky, weighted): the app's to route
        level = _Level()
        request = RequestHead(
            endpoint,
            model,
            asked_version,
            head.content_type,
            head.content_length,
            head.content_encoding,
            head.timeout,
            head.priority,
            backlog=backlog,
        )
        try:
            return admit(service, request, None, level, spent)  # no key: with keys on nothing is decided here
        except (QueueFull, RateLimited) as refused:
            error: TwinserveError = refused
        except TwinserveError:
            return None
        try:
            runtime = service.runtime(model, asked_version)
        except TwinserveError:
            return None  # shed before the model was known, and it is unknown: the app counts it without a label
        service.refused_early(runtime.name, runtime.spec.version, endpoint, level.priority, error.status, error.code)
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
    `Accept-Encoding`, and the body's declared type, length and codings and the request's timeout header."""

    path: str
    priority: str | None
    request_id: str | None
    accept_encoding: str | None
    content_type: str | None = None
    content_length: int | None = None
    content_encoding: str | None = None
    timeout: str | None = None


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
