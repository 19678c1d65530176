"""OpenTelemetry spans for every request, off unless `--tracing` (the `otel` extra).

Off, nothing here imports OpenTelemetry and `RequestContext.trace` is None. On, each serving process sets up its
own TracerProvider with a BatchSpanProcessor, configured by the standard `OTEL_*` variables (exporter `otlp` by
default, `service.name` twinserve). Each request is one SERVER span named after its route, continuing an incoming
`traceparent`, with children `preprocess`, `queue_wait` and `predict`; each request of a shared batch gets its own
predict span over the same interval (the first lists the batch's request ids, the others link to it), and it is
the current span while the batch computes, so a model's own spans nest under it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from twinserve.config import Config
from twinserve.errors import ConfigError, MissingExtra, TwinserveError
from twinserve.extras import import_extra

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Link, Span

__all__ = ["BatchTrace", "Headers", "RequestTrace", "Tracer", "check_tracing", "setup_tracing", "shutdown_tracing"]

EXPORTERS = ("otlp", "console", "none")
DEFAULT_SERVICE_NAME = "twinserve"
_OTEL = {"extra": "otel", "what": "--tracing", "needs": "OpenTelemetry"}


class Headers(Protocol):
    """Request headers as both fronts expose them: a case-insensitive `get`."""

    def get(self, key: str, /) -> str | None: ...


def _exporter_names() -> list[str]:
    names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} is not one of {', '.join(EXPORTERS)}")
    if "otlp" in names:
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        if protocol not in (None, "", "http/protobuf"):
            raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: twinserve exports http/protobuf only, not {protocol!r}")
    return [n for n in names if n != "none"]


def _disabled_by_sdk() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def check_tracing(config: Config) -> None:
    """Fail at start-up, before any port is bound, if `--tracing` cannot work here."""
    if not config.tracing:
        return
    for module in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        import_extra(module, **_OTEL)
    _exporter_names()


class Tracer:
    """This process's TracerProvider and exporters, and the spans twinserve makes with them."""

    def __init__(self, config: Config) -> None:
        try:
            from opentelemetry import propagate, trace
            from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise MissingExtra(**_OTEL) from None

        names = _exporter_names()
        # Our default service name only where the environment names none (Resource.create's own arguments win).
        named = SERVICE_NAME in OTELResourceDetector().detect().attributes
        resource = Resource.create({} if named else {SERVICE_NAME: DEFAULT_SERVICE_NAME})
        self.provider: TracerProvider = TracerProvider(resource=resource)
        for name in names:
            self.provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        trace.set_tracer_provider(self.provider)  # spans the model makes itself go to the same exporters
        self.tracer = self.provider.get_tracer("twinserve")
        self.arch = config.arch
        self.extract = propagate.extract
        self.in_context = trace.set_span_in_context
        self.use_span = trace.use_span
        self.server_kind = trace.SpanKind.SERVER
        self.error_status = trace.StatusCode.ERROR
        self.link = trace.Link

    def request(self, method: str, path: str, request_id: str, headers: Headers | None) -> RequestTrace:
        """Open the SERVER span of one request, as a child of the caller's span if it sent a `traceparent`."""
        parent = self.extract(headers) if headers is not None else None
        span = self.tracer.start_span(
            method,  # renamed after its route once the route is known
            context=parent,
            kind=self.server_kind,
            attributes={
                "http.request.method": method,
                "url.path": path,
                "twinserve.request_id": request_id,
                "twinserve.arch": self.arch,
            },
        )
        return RequestTrace(self, span, method)

    def shutdown(self) -> None:
        """Export what is still buffered and stop the exporters."""
        self.provider.shutdown()


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # One JSON object per line, each written at once, like the log lines it shares the terminal with.
        out = open(sys.stdout.fileno(), "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class RequestTrace:
    """The spans of one request; exists only when tracing is on.

    A request the sampler leaves out keeps its one non-recording span, current while its model code runs (so
    outgoing calls still carry the decision), and makes no children.
    """

    __slots__ = ("_parent", "method", "recording", "span", "tracer")

    def __init__(self, tracer: Tracer, span: Span, method: str) -> None:
        self.tracer = tracer
        self.span = span
        self.method = method
        self.recording = span.is_recording()
        self._parent: Context | None = None

    @property
    def parent(self) -> Context:
        """The request span as a context to start its children in."""
        if self._parent is None:
            self._parent = self.tracer.in_context(self.span)
        return self._parent

    def child(
        self,
        name: str,
        start_time: int | None = None,
        attributes: dict[str, Any] | None = None,
        links: Sequence[Link] | None = None,
    ) -> Span:
        return self.tracer.tracer.start_span(
            name, context=self.parent, start_time=start_time, attributes=attributes, links=links
        )

    def preprocess(self) -> AbstractContextManager[Span]:
        """The preprocess span, current while the model's preprocess runs."""
        if not self.recording:
            return self.tracer.use_span(self.span, end_on_exit=False)
        return self.tracer.tracer.start_as_current_span("preprocess", context=self.parent)

    def finish(self, route: str | None, model: str, status: int, error_code: str | None) -> None:
        if not self.recording:
            return
        span = self.span
        attributes: dict[str, Any] = {"http.response.status_code": status}
        if route is not None:
            span.update_name(f"{self.method} {route}")
            attributes["http.route"] = route
        if model:
            attributes["twinserve.model"] = model
        if error_code is not None:
            attributes["error.type"] = error_code
        span.set_attributes(attributes)
        if status >= 500:  # a 4xx is the client's doing, not a failure of this server
            span.set_status(self.tracer.error_status, error_code)
        span.end()


class Traced(Protocol):
    """What a batch's trace reads of each request (observability/context.py `RequestContext`, which holds the
    request's trace: this module does not import it back)."""

    @property
    def trace(self) -> RequestTrace | None: ...

    @property
    def queue_wait_s(self) -> float | None: ...


class BatchTrace:
    """The queue_wait and predict spans of the traced requests of one batch, made as the batch starts.

    Used as a context manager around the batch's compute: the first predict span (else an unsampled request's
    span) is current meanwhile, and every predict span ends, with the error if there is one, when the compute does.
    """

    __slots__ = ("_current", "_predict", "_scope", "_tracer")

    def __init__(self, requests: Sequence[Traced], ids: Sequence[str], size: int) -> None:
        now = time.time_ns()
        attributes: dict[str, Any] = {"twinserve.batch_size": size, "twinserve.batch_requests": len(ids)}
        links: list[Link] | None = None
        self._predict: list[Span] = []
        self._current: Span | None = None
        self._tracer: Tracer | None = None
        for context in requests:
            trace = context.trace
            if trace is None:
                continue
            self._tracer = trace.tracer
            if not trace.recording:
                self._current = self._current or trace.span
                continue
            wait_ns = round((context.queue_wait_s or 0.0) * 1e9)
            trace.child("queue_wait", start_time=now - wait_ns).end(end_time=now)
            if links is None:
                lead = trace.child("predict", now, {**attributes, "twinserve.request_ids": list(ids)})
                links = [trace.tracer.link(lead.get_span_context())]
                self._predict.append(lead)
            else:
                self._predict.append(trace.child("predict", now, attributes, links))
        if self._predict:
            self._current = self._predict[0]
        self._scope: AbstractContextManager[Span] | None = None

    def __enter__(self) -> None:
        if self._tracer is not None and self._current is not None:
            self._scope = self._tracer.use_span(self._current, end_on_exit=False)
            self._scope.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._scope is not None:
            self._scope.__exit__(None, None, None)  # the error goes on every predict span alike, below
        end = time.time_ns()
        for span in self._predict:
            if exc is not None and self._tracer is not None:
                span.set_attribute("error.type", exc.code if isinstance(exc, TwinserveError) else type(exc).__name__)
                span.set_status(self._tracer.error_status, str(exc))
            span.end(end_time=end)


_active: Tracer | None = None


def setup_tracing(config: Config) -> Tracer | None:
    """This process's tracer when `--tracing` is on (made on the first call), else None without importing a thing."""
    global _active
    if not config.tracing or _disabled_by_sdk():
        return None
    if _active is None:
        _active = Tracer(config)
    return _active


def shutdown_tracing() -> None:
    """Flush this process's spans and stop its exporters (a no-op when tracing is off)."""
    global _active
    if _active is not None:
        _active.shutdown()
        _active = None
