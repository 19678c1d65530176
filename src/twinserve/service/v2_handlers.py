"""The Open Inference Protocol's (V2) metadata, readiness, configuration and statistics handlers of `Service`.

A mixin, so the route table keeps naming every handler on one object: `Service` supplies the look-ups it declares
(`runtime`, `codecs_of`, the registry), and this module keeps the V2 shapes out of the contract's request life.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from twinserve.core.runtime import ModelRuntime
from twinserve.observability.metrics import InferenceTotals, inference_totals
from twinserve.protocol.codecs import ModelCodecs
from twinserve.protocol.v1 import dumps
from twinserve.protocol.v2 import BINARY, HEADER_LENGTH, InferenceRequest, server_metadata, statistics
from twinserve.repository import ModelRegistry
from twinserve.service.reply import NOT_READY_HEADERS, Reply
from twinserve.service.routes import INFERENCE_ENDPOINTS

__all__ = ["OpenInferenceHandlers"]


class OpenInferenceHandlers:
    """V2's model and server endpoints (besides `/infer` itself, which is every front's predict path)."""

    registry: ModelRegistry
    runtimes: dict[str, ModelRuntime]

    def runtime(self, model: str, version: str | None = None) -> ModelRuntime:
        raise NotImplementedError  # Service's

    def codecs_of(self, runtime: ModelRuntime) -> ModelCodecs:
        raise NotImplementedError  # Service's

    @cached_property
    def _server_metadata(self) -> bytes:
        from twinserve import __version__

        return dumps(server_metadata(__version__))

    def server_metadata(self) -> Reply:
        return Reply(200, self._server_metadata)

    def v2_runtime(self, model: str, version: str | None = None) -> ModelRuntime:
        return self.runtime(model, version)

    def v2_model_metadata(self, model: str, version: str | None = None) -> Reply:
        """V2 model metadata: a version's, or (unversioned) the default's, listing every version ready now."""
        runtime = self.v2_runtime(model, version)
        metadata = self.codecs_of(runtime).v2.metadata()
        if version is None:
            ready = [e.version for e in self.registry.versions_of(runtime.name) if e.state == "READY"]
            metadata["versions"] = ready or metadata["versions"]
        return Reply(200, dumps(metadata))

    def model_ready(self, model: str, version: str | None = None) -> Reply:
        """200 once the model (version) is ready; 503 with `Retry-After` while it loads (KServe's model server's
        answer, and what a readiness probe or a load balancer reads as "not yet")."""
        runtime = self.v2_runtime(model, version)
        body = dumps({"name": runtime.name, "ready": runtime.ready})
        return Reply(200, body) if runtime.ready else Reply(503, body, dict(NOT_READY_HEADERS))

    def model_config(self, model: str, version: str | None = None) -> Reply:
        runtime = self.v2_runtime(model, version)
        v2 = self.codecs_of(runtime).v2
        settings = runtime.config  # the model's own: its batching, instances and queue policy
        return Reply(200, dumps(v2.config(runtime.max_batch_size, settings.max_batch_delay_ms, settings)))

    def model_stats(self, model: str | None = None, version: str | None = None) -> Reply:
        """Triton's statistics extension: one model's, or every model's when `model` is None."""
        runtimes = list(self.runtimes.values()) if model is None else [self.v2_runtime(model, version)]
        totals = inference_totals(INFERENCE_ENDPOINTS)
        stats = [statistics(r.name, r.spec.version, totals.get(r.name, InferenceTotals())) for r in runtimes]
        return Reply(200, dumps({"model_stats": stats}))

    def infer_reply(self, runtime: ModelRuntime, request: InferenceRequest, outputs: Any) -> Reply:
        body, header_length = self.codecs_of(runtime).v2.encode(request, outputs)
        if header_length is None:
            return Reply(200, body)
        return Reply(200, body, {HEADER_LENGTH: str(header_length)}, content_type=BINARY)
