"""OpenTelemetry spans in every architecture, received by a real OTLP/HTTP endpoint; none at all when off."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import opentelemetry.sdk.trace  # noqa: F401  the otel extra is part of `make test`: missing, these tests fail
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.conftest import ARCHS
from tests.serving import HTTP, ROOT, Server, model_path
from twinserve.config import load_config
from twinserve.errors import ConfigError
from twinserve.observability.tracing import check_tracing

MODELS = [model_path("Mixed"), model_path("Faulty"), model_path("Echo")]
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"
UNSAMPLED_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
UNSAMPLED = f"00-{UNSAMPLED_TRACE_ID}-{CALLER_SPAN_ID}-00"  # the caller decided not to sample this trace
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # milliseconds: spans arrive while the test waits for them


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    start: int
    end: int
    status: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    """A minimal OTLP/HTTP traces endpoint on a free loopback port: decodes each protobuf export into `spans`."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.receive(ExportTraceServiceRequest.FromString(body))
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def receive(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.SpanKind.Name(s.kind),
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            status=s.status.StatusCode.Name(s.status.code),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            resource=resource,
                        )
                    )
        with self.lock:
            self.spans.extend(spans)

    def received(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def wait_for(self, condition: Callable[[list[Span]], bool], timeout: float = 30.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans never met the condition; received: {[s.name for s in spans]}")
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    endpoint = OtlpReceiver()
    yield endpoint
    endpoint.close()


def otlp_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **FAST_EXPORT}


def post(server: Server, model: str, instances: list[Any], request_id: str, traceparent: str | None = None) -> int:
    headers = {"X-Request-Id": request_id}
    if traceparent:
        headers["traceparent"] = traceparent
    url = f"{server.url}/v1/models/{model}:predict"
    return HTTP.post(url, json={"instances": instances}, headers=headers, timeout=30).status_code


def request_span(spans: list[Span], request_id: str) -> Span | None:
    return next(
        (s for s in spans if s.kind == "SPAN_KIND_SERVER" and s.attributes.get("twinserve.request_id") == request_id),
        None,
    )


def children(spans: list[Span], parent: Span) -> dict[str, Span]:
    found = {s.name: s for s in spans if s.parent_id == parent.span_id}
    assert all(s.trace_id == parent.trace_id for s in found.values())
    return found


@pytest.mark.parametrize("arch", ARCHS)
def test_a_request_span_continues_the_callers_trace_with_its_stages_as_children(
    arch: str, receiver: OtlpReceiver
) -> None:
    with Server(MODELS, arch, "--tracing", "--workers", "1", env=otlp_env(receiver)) as server:
        assert post(server, "mixed", [{"x": 2, "y": 3}], f"{arch}-unsampled", UNSAMPLED) == 200
        assert post(server, "mixed", [{"x": 2, "y": 3}], f"{arch}-traced", TRACEPARENT) == 200
        assert post(server, "faulty", ["boom"], f"{arch}-failed") == 500
        spans = receiver.wait_for(
            lambda spans: all(request_span(spans, rid) for rid in (f"{arch}-traced", f"{arch}-failed"))
        )
    # The default sampler follows the caller's decision; every span was flushed as the server stopped.
    assert not [s for s in receiver.received() if s.trace_id == UNSAMPLED_TRACE_ID]

    span = request_span(spans, f"{arch}-traced")
    assert span is not None
    assert (span.trace_id, span.parent_id) == (TRACE_ID, CALLER_SPAN_ID)
    assert span.name == "POST /v1/models/{model}:predict"
    assert span.status == "STATUS_CODE_UNSET"
    assert span.attributes == {
        "http.request.method": "POST",
        "http.route": "/v1/models/{model}:predict",
        "http.response.status_code": 200,
        "url.path": "/v1/models/mixed:predict",
        "twinserve.request_id": f"{arch}-traced",
        "twinserve.model": "mixed",
        "twinserve.arch": arch,
    }
    assert span.resource["service.name"] == "twinserve"
    stages = children(spans, span)
    assert sorted(stages) == ["predict", "preprocess", "queue_wait"]
    assert stages["predict"].attributes == {
        "twinserve.batch_size": 1,
        "twinserve.batch_requests": 1,
        "twinserve.request_ids": [f"{arch}-traced"],
    }
    assert stages["predict"].links == []
    assert stages["queue_wait"].end == stages["predict"].start  # the batch started as the wait ended
    assert all(s.start <= s.end for s in stages.values())

    failed = request_span(spans, f"{arch}-failed")
    assert failed is not None
    assert failed.trace_id != TRACE_ID and failed.parent_id == ""  # no traceparent: a trace of its own
    assert (failed.status, failed.attributes["error.type"]) == ("STATUS_CODE_ERROR", "model_error")
    predict = children(spans, failed)["predict"]
    assert (predict.status, predict.attributes["error.type"]) == ("STATUS_CODE_ERROR", "model_error")

    # Probes are not traced: the readiness polls that started the server left no span.
    assert not [s for s in spans if s.attributes.get("url.path") == "/v2/health/ready"]


@pytest.mark.parametrize("arch", ARCHS)
def test_each_request_of_a_shared_batch_has_its_own_predict_span_linked_to_the_batch(
    arch: str, receiver: OtlpReceiver
) -> None:
    flags = ["--tracing", "--workers", "1", "--threads", "8", "--max-batch-size", "8", "--max-batch-delay-ms", "200"]
    ids = [f"{arch}-batch-{i}" for i in range(4)]
    with Server(MODELS, arch, *flags, env=otlp_env(receiver)) as server:
        with ThreadPoolExecutor(len(ids)) as pool:
            assert list(pool.map(lambda rid: post(server, "echo", [rid], rid), ids)) == [200] * len(ids)
        spans = receiver.wait_for(lambda spans: all(request_span(spans, rid) for rid in ids))

    by_id = {(s.trace_id, s.span_id): s for s in spans}
    batches = set()
    for rid in ids:
        span = request_span(spans, rid)
        assert span is not None
        stages = children(spans, span)
        assert sorted(stages) == ["predict", "queue_wait"]
        predict = stages["predict"]
        # The batch's first request's predict span names them all; the others link to it, in its own trace.
        lead = by_id[predict.links[0]] if predict.links else predict
        assert lead.name == "predict" and not lead.links
        batch = lead.attributes["twinserve.request_ids"]
        assert rid in batch
        assert predict.attributes["twinserve.batch_requests"] == len(batch)
        assert predict.attributes["twinserve.batch_size"] == len(batch)  # one instance per request
        assert (predict.start, predict.end) == (lead.start, lead.end)
        batches.add(tuple(batch))
    assert any(len(batch) > 1 for batch in batches), "the delay should have gathered some requests into one batch"
    assert sorted(rid for batch in batches for rid in batch) == sorted(ids)


def test_console_exporter_writes_one_json_span_per_line_under_the_service_name() -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "ranker", **FAST_EXPORT}
    with Server(MODELS, "async", "--tracing", "--log-format", "json", env=env) as server:
        assert post(server, "echo", [1], "console-traced", TRACEPARENT) == 200
        server.wait_for_output('"twinserve.request_id": "console-traced"')
        lines = [json.loads(line) for line in server.output().splitlines() if line.strip()]

    spans = [line for line in lines if "context" in line and "kind" in line]
    by_name = {s["name"]: s for s in spans if s["context"]["trace_id"] == f"0x{TRACE_ID}"}
    assert sorted(by_name) == ["POST /v1/models/{model}:predict", "predict", "queue_wait"]
    root = by_name["POST /v1/models/{model}:predict"]
    assert (root["kind"], root["parent_id"]) == ("SpanKind.SERVER", f"0x{CALLER_SPAN_ID}")
    assert root["attributes"]["twinserve.request_id"] == "console-traced"
    assert root["resource"]["attributes"]["service.name"] == "ranker"
    assert by_name["predict"]["parent_id"] == by_name["queue_wait"]["parent_id"] == root["context"]["span_id"]


@pytest.mark.parametrize("arch", ARCHS)
def test_no_span_at_all_when_tracing_is_off(arch: str, receiver: OtlpReceiver) -> None:
    env = {**otlp_env(receiver), "OTEL_TRACES_EXPORTER": "otlp,console"}
    with Server(MODELS, arch, "--workers", "1", "--log-format", "json", env=env) as server:
        assert post(server, "mixed", [{"x": 2, "y": 3}], f"{arch}-untraced", TRACEPARENT) == 200
        server.wait_for_output(f'"request_id":"{arch}-untraced"')
        server.terminate()  # a tracer would flush its spans on the way out
        assert server.process is not None and server.process.wait(timeout=30) == 0
        output = server.output()
    assert receiver.received() == []
    assert "trace_id" not in output


def test_tracing_off_never_imports_the_sdk() -> None:
    """Off means no OpenTelemetry import of ours: none at all under Flask (FastAPI imports the API itself)."""
    script = """
import sys
from starlette.testclient import TestClient
from twinserve.config import load_config
from twinserve.core.runtime import load_runtimes
from twinserve.service.contract import Service
from twinserve.servers.served import Served
from twinserve.servers.sync.server import build_wsgi_app

config = load_config(models=["twinserve.examples.tabular:Classifier"])
flower = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
body = {"instances": [flower]}
assert build_wsgi_app(Served(config)).test_client().post("/v1/models/iris:predict", json=body).status_code == 200
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
from twinserve.fronts.asgi import create_asgi_app

config = load_config(models=["twinserve.examples.tabular:Classifier"], arch="async")
with TestClient(create_asgi_app(Service(load_runtimes(config), config)), base_url="http://localhost") as client:
    assert client.post("/v1/models/iris:predict", json=body).status_code == 200
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["[]", "[]"]


def test_tracing_without_the_extra_fails_at_startup_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "opentelemetry"
    missing.mkdir()
    (missing / "__init__.py").write_text("raise ImportError('opentelemetry is not installed (simulated)')\n")
    env = {"PYTHONPATH": str(tmp_path), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", "serve", "--arch", "async", "--tracing", "--port", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "twinserve: error: --tracing needs OpenTelemetry: pip install 'twinserve[otel]'"


def test_an_unknown_exporter_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ConfigError, match=r"^OTEL_TRACES_EXPORTER: zipkin is not one of otlp, console, none$"):
        check_tracing(load_config(tracing=True))
    check_tracing(load_config(tracing=False))  # not looked at when tracing is off
