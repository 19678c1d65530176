"""The route table both fronts serve, and the names they share. Each front maps these onto its framework."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EVENT_STREAM",
    "HTML",
    "INFERENCE_ENDPOINTS",
    "JSON",
    "JSON_MEDIA_TYPE",
    "MODEL_NAME_PATTERN",
    "QUIET_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "ROUTES",
    "STATE_CHANGING_ENDPOINTS",
    "ErrorShape",
    "Route",
    "error_shape",
    "is_v2",
]

JSON = "application/json"
#: A JSON media type, `application/json` or a `+json` suffix (RFC 6839), as a request's Content-Type names it.
JSON_MEDIA_TYPE = re.compile(r"^application/(?:[\w.+-]+\+)?json$")
EVENT_STREAM = "text/event-stream"
HTML = "text/html; charset=utf-8"
REQUEST_ID_HEADER = "X-Request-ID"
#: Model names never contain '/' or ':' so that `/v1/models/{model}:predict` is unambiguous.
MODEL_NAME_PATTERN = r"[^/:]+"


@dataclass(frozen=True)
class Route:
    """One endpoint: the handler name on `Service` (or the front, for `predict`), method and path template."""

    name: str
    method: str
    path: str  # `{model}` marks the model-name segment, `{version}` a model version


def _v2_model(name: str, method: str, suffix: str) -> tuple[Route, Route]:
    """A V2 model route and its `/versions/{version}` twin."""
    return (
        Route(name, method, "/v2/models/{model}" + suffix),
        Route(name, method, "/v2/models/{model}/versions/{version}" + suffix),
    )


ROUTES: tuple[Route, ...] = (
    Route("alive", "GET", "/"),  # KServe V1's liveness probe: `{"status": "alive"}`
    Route("list_models", "GET", "/v1/models"),  # KServe V1: the names; details at /v1/models/{model}
    Route("model_metadata", "GET", "/v1/models/{model}"),
    Route("predict", "POST", "/v1/models/{model}:predict"),
    # TF-Serving's REST API names a version in the path: 404 unless it is the one served.
    Route("predict", "POST", "/v1/models/{model}/versions/{version}:predict"),
    Route("stream", "POST", "/v1/models/{model}:stream"),  # a streaming model's steps, as Server-Sent Events
    # A WebSocket stream of predict messages (async and hybrid; the sync architecture answers 501).
    Route("websocket", "GET", "/v1/models/{model}/ws"),
    Route("live", "GET", "/v2/health/live"),
    Route("ready", "GET", "/v2/health/ready"),
    # The Open Inference Protocol (KServe V2), with Triton's model configuration and statistics extensions.
    Route("server_metadata", "GET", "/v2"),
    Route("model_stats", "GET", "/v2/models/stats"),  # every model (before `{model}`, which it would match)
    *_v2_model("v2_model_metadata", "GET", ""),
    *_v2_model("model_ready", "GET", "/ready"),
    *_v2_model("infer", "POST", "/infer"),
    *_v2_model("model_config", "GET", "/config"),
    *_v2_model("model_stats", "GET", "/stats"),
    # Triton's and MLServer's model-repository extension: every model and version with its state (docs/repository.md).
    Route("repository_index", "POST", "/v2/repository/index"),
    Route("repository_load", "POST", "/v2/repository/models/{model}/load"),
    Route("repository_unload", "POST", "/v2/repository/models/{model}/unload"),
    # A model's traffic split and shadow across its versions (twinserve's own; repository/traffic.py).
    Route("repository_traffic", "GET", "/v2/repository/models/{model}/traffic"),
    Route("repository_set_traffic", "POST", "/v2/repository/models/{model}/traffic"),
    Route("openapi", "GET", "/openapi.json"),
    Route("docs", "GET", "/docs"),
    Route("docs_css", "GET", "/docs/swagger-ui.css"),  # Swagger UI's own files, from the package: no CDN
    Route("docs_js", "GET", "/docs/swagger-ui-bundle.js"),
    Route("metrics", "GET", "/metrics"),
)

#: The endpoints that reach a model's `predict`, whichever protocol.
INFERENCE_ENDPOINTS = frozenset({"predict", "stream", "infer", "websocket"})
#: The endpoints that change what the server serves: refused cross-site, JSON bodies only (`Service.check_site`).
STATE_CHANGING_ENDPOINTS = frozenset({"repository_load", "repository_unload", "repository_set_traffic"})
#: Health probes and scrapes: logged at debug level, not traced, not counted in flight.
QUIET_ENDPOINTS = frozenset({"alive", "live", "ready", "model_ready", "metrics"})


#: How an error body looks (docs/http-contract.md "Error bodies"): twinserve's `{"error": {"code", "message",
#: "request_id"}}`; V1's `{"error": "message", "code", "request_id"}`, the string TF-Serving's and KServe's clients
#: read as the message; the Open Inference Protocol's `{"error": "message"}`.
ErrorShape = Literal["twinserve", "v1", "v2"]


def error_shape(path: str) -> ErrorShape:
    """The error body a request for `path` gets: by its protocol's prefix, whether or not a route matches it. The
    model repository's routes (an extension, not the Open Inference Protocol) answer V1's, whose `error` is the
    message Triton's and KServe's clients read, with the `code` and `request_id` every other error has."""
    if path.startswith(_REPOSITORY):
        return "v1"
    if is_v2(path):
        return "v2"
    if path == "/v1" or path.startswith("/v1/"):
        return "v1"
    return "twinserve"


_REPOSITORY = "/v2/repository/"


def is_v2(path: str) -> bool:
    """Whether errors on `path` take the V2 body `{"error": "message"}` (the health probes keep twinserve's)."""
    return path == "/v2" or (path.startswith("/v2/") and not path.startswith("/v2/health/"))
