"""The HTTP contract both fronts serve: one route table, one set of handlers, one error rendering.

Everything here is framework-free. A front maps each `Route` onto its framework, turns the request into the
arguments below, and differs from the other front only in how it waits for `ModelRuntime.predict`.
"""

from __future__ import annotations

import itertools
import os
import re
import time
import weakref
from collections.abc import Mapping
from functools import cached_property

from twinserve.config import Config
from twinserve.core.admission import Admission
from twinserve.core.readiness import ServerReadiness
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import (
    NotStreaming,
    PayloadTooLarge,
    TwinserveError,
    error_payload,
)
from twinserve.observability.context import RequestContext, close_request, open_request
from twinserve.observability.logging import request_logger
from twinserve.observability.metrics import CONTENT_TYPE, metrics, render
from twinserve.observability.refusals import SHED_CODES
from twinserve.observability.sums import Writes, metric_sums
from twinserve.observability.tracing import Headers, Tracer
from twinserve.protocol.codecs import ModelCodecs
from twinserve.protocol.v1 import dumps
from twinserve.repository import ModelRegistry
from twinserve.repository.desired import RepositoryFollower
from twinserve.repository.poll import RepositoryPoller
from twinserve.repository.residency import Residency
from twinserve.repository.shadow import ShadowRunner
from twinserve.service.auth import authenticator, key_id
from twinserve.service.clients import ForwardedFor
from twinserve.service.cors import cors_policy
from twinserve.service.hosts import check_site, host_policy
from twinserve.service.lifecycle import BodyRule
from twinserve.service.openapi import SWAGGER_ASSETS, openapi_document, secure, swagger_asset, swagger_page
from twinserve.service.reply import NOT_READY_HEADERS, Reply, error_reply
from twinserve.service.repository_api import RepositoryApi
from twinserve.service.request_counts import RequestCounts
from twinserve.service.response import http1_response
from twinserve.service.routes import (
    HTML,
    JSON,
    QUIET_ENDPOINTS,
    REQUEST_ID_HEADER,
    ROUTES,
    Route,
)
from twinserve.service.v2_handlers import OpenInferenceHandlers

__all__ = [
    "JSON",
    "REQUEST_ID_HEADER",
    "ROUTES",
    "Reply",
    "Route",
    "Service",
    "error_reply",
    "raw_error_response",
    "request_id_from",
]


def _reset_ids() -> None:
    """Request ids must be unique, not secret: a random per-process prefix and a counter (cheaper than uuid4)."""
    global _ID_PREFIX, _ids
    _ID_PREFIX = os.urandom(8).hex()
    _ids = itertools.count()


_ID_PREFIX = ""
_ids = itertools.count()
_reset_ids()
os.register_at_fork(after_in_child=_reset_ids)  # gunicorn forks its workers after importing this module
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_ROUTE_PATHS: dict[str, str] = {}
for _route in ROUTES:
    _ROUTE_PATHS.setdefault(_route.name, _route.path)  # a V2 route before its `/versions/{version}` twin
_UNTRACED_PATHS = frozenset(route.path for route in ROUTES if route.name in QUIET_ENDPOINTS)


def _open_paths(config: Config) -> frozenset[str]:
    """Paths served without an API key when keys are configured."""
    names = {"alive", "live", "ready"}
    if not config.metrics_auth:
        names.add("metrics")
    if config.public_docs:
        names |= {"openapi", "docs", "docs_css", "docs_js"}
    return frozenset(route.path for route in ROUTES if route.name in names)


def request_id_from(header: str | None) -> str:
    """Echo a client's request id when it is safe to put in headers and logs, else make one."""
    if header and _CLIENT_ID.match(header):
        return header
    return f"{_ID_PREFIX}{next(_ids):016x}"


def raw_error_response(error: TwinserveError) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, for errors an HTTP server meets while it
    parses a request (request line or headers too large), before any front sees it. Its body is twinserve's; its
    head the one response writer's (service/response.py)."""
    request_id = request_id_from(None)
    return http1_response(Reply(error.status, dumps(error_payload(error, request_id))), request_id)


class Service(OpenInferenceHandlers):
    """The transport-free handlers behind every route, over the models this process serves."""

    def __init__(
        self, runtimes: Mapping[str, ModelRuntime] | ModelRegistry, config: Config, tracer: Tracer | None = None
    ) -> None:
        #: Every model and version with its state; MODEL arguments' runtimes make a strict one (repository/).
        self.registry = runtimes if isinstance(runtimes, ModelRegistry) else ModelRegistry.of_runtimes(runtimes, config)
        #: Model name -> its default version's runtime (the registry's own dict: it follows loads and unloads).
        self.runtimes = self.registry.runtimes
        #: Requests (and WebSocket messages) between their exchange's open and close.
        self.in_flight = metrics().in_flight
        #: Each runtime's protocol codecs (`codecs_of`): the core's runtimes take and return instances only.
        self._codecs: weakref.WeakKeyDictionary[ModelRuntime, ModelCodecs] = weakref.WeakKeyDictionary()
        self.config = config
        self.tracer = tracer
        self.max_body_bytes = config.max_body_bytes
        #: What every front decides about the body bytes it reads: too large, cut short, too late.
        self.body = BodyRule(config.max_body_bytes, config.read_timeout_s, self.too_large)
        #: Whether a model's exception text may reach the client (`--expose-errors`, `--debug`).
        self.expose_errors = config.effective_expose_errors
        #: None when no API key is configured: the fronts then skip authentication with one `is None` check.
        self.auth = authenticator(config)
        #: Every admission rule: rate limits (server-wide and per key), the backlog bound, deadlines.
        levels = {key_id(key): level for key, level in config.api_key_priorities().items()}
        self.admission = Admission(config, self.auth.keys.ids if self.auth is not None else (), key_priorities=levels)
        self.forwarded = ForwardedFor(config.forwarded_allow_ips)
        self.cors = cors_policy(config)
        self.hosts = host_policy(config)
        #: False when any Host is served (bound to 0.0.0.0, or `--allowed-hosts '*'`): the fronts skip the check.
        self.checks_host = not self.hosts.any_host
        self.open_paths = _open_paths(config)
        #: This process's metric writes, summed per interval (observability/sums.py).
        self.sums = metric_sums()
        #: What answered requests, and those refused before the app, are counted in (service/request_counts.py).
        self.counts = RequestCounts(self.registry)
        self._access_log = request_logger() if config.access_log else None
        #: Loads and unloads (None: `--model-control none`, or MODEL arguments); only the admin key may ask.
        #: The repository API (index, load, unload) and what keeps this process's models in step (`watch`).
        self.repository = RepositoryApi(self.registry, config, self.auth is not None)
        #: Computes the requests mirrored to a shadow version, off their path (repository/shadow.py).
        self.shadows = ShadowRunner()
        #: Requests wait here for a loading model; `--max-loaded-models` loads on demand and evicts (LRU).
        self.residency = Residency(self.registry, self.repository.changes, config)
        #: Whether the server's other processes have loaded too (None: this one is the server): core/readiness.py.
        self.peers = ServerReadiness.attach(config.effective_workers)

    # -- metadata and health -----------------------------------------------------------------------------
    def codecs_of(self, runtime: ModelRuntime) -> ModelCodecs:
        """The protocol codecs of `runtime` (one per model version: versions may differ in types)."""
        codecs = self._codecs.get(runtime)
        if codecs is None:
            codecs = self._codecs[runtime] = ModelCodecs.of(runtime.spec, runtime.config)
        return codecs

    def list_models(self) -> Reply:
        """KServe V1's listing: the served models' names (`GET /v1/models/{model}` has each one's details)."""
        return Reply(200, dumps({"models": list(self.runtimes)}))

    def model_metadata(self, model: str) -> Reply:
        """KServe V1's model status and twinserve's details: 503 (`"ready": false`) while the model loads, as
        KServe's model server answers a model that is not ready."""
        runtime = self.runtime(model)
        v1 = self.codecs_of(runtime).v1
        schemas = {"input_schema": v1.input_schema(), "output_schema": v1.output_schema()}
        versions = [entry.describe() for entry in self.registry.versions_of(runtime.name)]
        body = dumps({**runtime.metadata(), **schemas, "versions": versions})
        return Reply(200, body) if runtime.ready else Reply(503, body, dict(NOT_READY_HEADERS))

    @cached_property
    def _openapi(self) -> bytes:
        from twinserve import __version__

        codecs = {name: self.codecs_of(runtime) for name, runtime in self.runtimes.items()}
        document = openapi_document(self.runtimes, codecs, "twinserve", __version__)
        return dumps(document if self.auth is None else secure(document, self.open_paths))

    def openapi(self) -> Reply:
        return Reply(200, self._openapi)

    def docs(self) -> Reply:
        return Reply(200, swagger_page("/openapi.json", "twinserve"), content_type=HTML)

    def docs_asset(self, name: str) -> Reply:
        """A Swagger UI file (`SWAGGER_ASSETS`), cacheable for a day: it changes only with the package."""
        media_type = SWAGGER_ASSETS[name][1]
        return Reply(200, swagger_asset(name), {"Cache-Control": "public, max-age=86400"}, content_type=media_type)

    def metrics(self) -> Reply:
        self.counts.flush()
        return Reply(200, render(), content_type=CONTENT_TYPE)

    # -- allowed hosts, authentication and CORS (service/hosts.py, service/auth.py, service/cors.py) --------------
    def check_host(self, host: str | None) -> None:
        """HostNotAllowed (400) for a `Host` header outside `--allowed-hosts` (DNS rebinding), before anything
        else is done for the request: a preflight, authentication or routing."""
        if self.checks_host:
            self.hosts.check_host(host)

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        """Whether a page from `origin` may open a WebSocket on a request saying `Host: host`: the same origin,
        one `--cors-origins` allows, or one on a named allowed host (cross-site WebSocket hijacking)."""
        return (self.cors is not None and self.cors.allows(origin)) or self.hosts.allows_origin(origin, host)

    def check_site(self, endpoint: str, headers: Headers) -> None:
        """CrossSite (403), or 415, for what a page on another site could send without a preflight to a route that
        changes state, or as a form to a predict (service/hosts.py `check_site`)."""
        check_site(endpoint, headers, lambda origin: self.origin_allowed(origin, headers.get("host")))

    def authenticate(self, headers: Headers, peer: str | None = None) -> str | None:
        """The id of the API key `headers` present (None when authentication is off), for HTTP requests and
        WebSocket handshakes alike, from a connection whose peer is `peer` (None: unknown). Raises Unauthorized
        (401) or RateLimited (429): past the key's rate limit, or with the client's address (`peer`, or the one a
        trusted proxy forwarded) locked out after too many wrong keys."""
        if self.auth is None:
            return None
        client = None
        if self.auth.lockout is not None and peer is not None:
            client = self.forwarded.client(peer, headers.get("x-forwarded-for"))
        kid = self.auth.authenticate(headers, client)
        self.admission.charge(kid)
        return kid

    def requires_auth(self, path: str) -> bool:
        """Whether a request for `path` must present a key (probes and, unless configured, scrapes need none)."""
        return self.auth is not None and path not in self.open_paths

    def is_preflight(self, method: str, headers: Headers) -> bool:
        """Whether this is a CORS preflight the server answers (only with CORS on), before authentication:
        browsers send no credentials on a preflight."""
        return (
            self.cors is not None
            and method == "OPTIONS"
            and headers.get("origin") is not None
            and headers.get("access-control-request-method") is not None
        )

    def preflight(self, headers: Headers) -> Reply:
        """The answer to a preflight (`is_preflight`): 204 with its grant; raises CorsRejected (403) otherwise."""
        assert self.cors is not None
        origin, method = headers.get("origin"), headers.get("access-control-request-method")
        assert origin is not None and method is not None
        allowed = self.cors.preflight(origin, method, headers.get("access-control-request-headers"))
        return Reply(204, b"", allowed, content_type="")

    # -- every request, from every front -------------------------------------------------------------------
    def begin(
        self, request_id_header: str | None, method: str, path: str, headers: Headers | None = None
    ) -> RequestContext:
        """Open a request: its id (the client's, if safe) becomes the context model code and log lines see.

        `headers` carry the caller's trace context (`traceparent`), read only when tracing is on. Probes and
        scrapes are not traced, as they are not logged above debug level.
        """
        context = RequestContext(request_id_from(request_id_header), method, path)
        if self.tracer is not None and path not in _UNTRACED_PATHS:
            context.trace = self.tracer.request(method, path, context.request_id, headers)
        open_request(context)
        return context

    def finish(
        self,
        context: RequestContext,
        endpoint: str,
        model: str,
        status: int,
        error_code: str | None,
        version: str | None = None,
    ) -> Writes:
        """Log one answered request (the same call from every front) and return its metric writes, for the caller
        to hand to `sums` (`MetricSums.ended`); `version`: the model version that answered it (None: none was
        admitted)."""
        seconds = time.perf_counter() - context.started
        if model not in self.runtimes and not self.registry.knows(model):
            model = ""  # never a label value a client can invent
        if self._access_log is not None:
            # Probes and scrapes arrive every few seconds for the server's whole life: they are debug noise.
            quiet = endpoint in QUIET_ENDPOINTS or error_code in SHED_CODES  # refusals: one line an interval
            log = self._access_log.debug if quiet else self._access_log.info
            log(
                "request",
                request_id=context.request_id,
                method=context.method,
                path=context.path,
                model=model or None,
                version=version if model else None,
                endpoint=endpoint,
                arch=self.config.arch,
                status=status,
                error=error_code,
                latency_ms=round(seconds * 1000, 3),
                batch_size=context.batch_size,
                priority=context.priority,
                queue_wait_ms=None if context.queue_wait_s is None else round(context.queue_wait_s * 1000, 3),
            )
        close_request()
        if context.trace is not None:
            context.trace.finish(_ROUTE_PATHS.get(endpoint), model, status, error_code)
        # Summed per interval, not written per request (observability/sums.py); `/metrics` writes them first.
        return self.counts.answered((model, endpoint, status, error_code, context.priority, version), seconds)

    def refused_early(
        self, model: str, version: str | None, endpoint: str, priority: int, status: int, error_code: str
    ) -> None:
        """Count a request the HTTP server refused from its head, before the app (fronts/early.py), as `finish`
        counts a refusal; it has no request context, so no request event and no latency (`RequestCounts`)."""
        self.counts.refused_early((model, version, endpoint, priority, status, error_code))

    def unparsed(self, error: TwinserveError) -> None:
        """Count a request the HTTP server answered with `error` before any route, as it could not read it (400
        `malformed_http`, 414, 431: servers/http1.py); like `refused_early`, no request event and no latency."""
        self.counts.unparsed(error.status, error.code)

    def live(self) -> Reply:
        return Reply(200, b'{"live":true}')

    def alive(self) -> Reply:
        """KServe V1's liveness (`GET /`), answered as KServe's model server does."""
        return Reply(200, b'{"status":"alive"}')

    def ready(self) -> Reply:
        """503 while any model is loading, the server's first load included (it answers before its models have
        loaded: `ModelRegistry.starting`), in this process or, at the start, in another of the server's
        (core/readiness.py), with the names of those still loading here; 200 once every one is ready."""
        not_ready = [name for name, r in self.runtimes.items() if not r.ready]
        if not_ready or self.registry.starting or (self.peers is not None and not self.peers.all_ready()):
            return Reply(503, dumps({"ready": False, "loading": not_ready}), dict(NOT_READY_HEADERS))
        return Reply(200, b'{"ready":true}')

    def started(self) -> None:
        """The server's first load has ended in this process (its models loaded, then what starts with them):
        ready from now on, once the server's other processes are too."""
        if self.peers is not None:
            self.peers.mark()
        self.registry.starting = False

    # -- predict, in the steps each front calls around its own way of waiting --------------------------------
    def runtime(self, model: str, version: str | None = None) -> ModelRuntime:
        """`model`'s runtime: its default version's, or `version`'s (404 unknown, 503 model_unavailable)."""
        runtime = self.runtimes.get(model) if version is None else None
        return runtime if runtime is not None else self.registry.runtime(model, version)

    def runtime_for(self, endpoint: str, model: str, version: str | None = None) -> ModelRuntime:
        """The runtime an inference endpoint asks for: 404 for an unknown model or V2 version, 400 for `:stream`
        on a model that does not stream."""
        return self._streamable(endpoint, model, self.v2_runtime(model, version))

    def route(
        self, endpoint: str, model: str, version: str | None = None, headers: Headers | None = None
    ) -> tuple[ModelRuntime, ModelRuntime | None]:
        """`runtime_for`, an unversioned request spread by its model's traffic split (sticky by `headers`), with
        the shadow version that computes it again once answered (None: none; never for a streaming model)."""
        policy = self.registry.traffic.get(model) if version is None else None
        if policy is None:
            return self.runtime_for(endpoint, model, version), None
        key = policy.key(headers)
        runtime = self._streamable(endpoint, model, self.registry.routed(model, key))
        shadow = None if runtime.spec.streams else self.registry.shadow_of(model, runtime.spec.version, key)
        return runtime, shadow

    def _streamable(self, endpoint: str, model: str, runtime: ModelRuntime) -> ModelRuntime:
        if endpoint == "stream" and not runtime.spec.streams:
            raise NotStreaming(f"model {model!r} does not stream (its predict is not a generator): use :predict")
        return runtime

    def first_chunk(self, context: RequestContext, model: str) -> None:
        """Note a stream's time to first step."""
        metrics().first_chunk_seconds.labels(model).observe(time.perf_counter() - context.started)

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds the {self.max_body_bytes}-byte limit (--max-body-bytes)")

    @property
    def watch(self) -> RepositoryPoller | RepositoryFollower | None:
        """The repository's poll, or the other server processes' explicit changes: the server starts it."""
        return self.repository.watch
