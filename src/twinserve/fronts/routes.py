"""The route table both fronts serve, and the names they share. Each front maps these onto its framework."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HTML", "JSON", "MODEL_NAME_PATTERN", "REQUEST_ID_HEADER", "ROUTES", "Route"]

JSON = "application/json"
HTML = "text/html; charset=utf-8"
REQUEST_ID_HEADER = "X-Request-ID"
#: Model names never contain '/' or ':' so that `/v1/models/{model}:predict` is unambiguous.
MODEL_NAME_PATTERN = r"[^/:]+"


@dataclass(frozen=True)
class Route:
    """One endpoint: the handler name on `Service` (or the front, for `predict`), method and path template."""

    name: str
    method: str
    path: str  # `{model}` marks the model-name segment


ROUTES: tuple[Route, ...] = (
    Route("list_models", "GET", "/v1/models"),
    Route("model_metadata", "GET", "/v1/models/{model}"),
    Route("predict", "POST", "/v1/models/{model}:predict"),
    Route("live", "GET", "/v2/health/live"),
    Route("ready", "GET", "/v2/health/ready"),
    Route("openapi", "GET", "/openapi.json"),
    Route("docs", "GET", "/docs"),
    Route("metrics", "GET", "/metrics"),
)
