"""An OpenAPI 3.1 document for the shared route table, with each served model's real request schema.

Each model gets its own concrete predict path (`/v1/models/iris:predict`) so `/docs` shows the exact instance
schema and a ready-to-send example body for it, and its V2 metadata and infer paths with its tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from twinserve.core.runtime import ModelRuntime
from twinserve.model import DATATYPES
from twinserve.protocol.codecs import ModelCodecs
from twinserve.protocol.v1 import json_default
from twinserve.protocol.v2 import V2Codec
from twinserve.service.routes import EVENT_STREAM, JSON, ROUTES, error_shape

__all__ = ["openapi_document", "secure", "swagger_page"]

_REF = "#/components/schemas/{model}"
_ERROR_SCHEMAS = {"twinserve": "Error", "v1": "V1Error", "v2": "V2Error"}

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "request_id": {"type": "string"},
                "details": {},
            },
            "required": ["code", "message", "request_id"],
        }
    },
    "required": ["error"],
}

#: V1 routes' errors (errors.py `v1_error_payload`): `error` is the message, as TF-Serving and KServe clients read it.
_V1_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "code": {"type": "string"},
        "request_id": {"type": "string"},
        "details": {},
    },
    "required": ["error", "code", "request_id"],
}

_ERRORS = {
    "400": "Malformed JSON",
    "404": "Unknown model",
    "413": "Body too large",
    "415": "Wrong content type",
    "422": "Instance fails the model's schema",
    "500": "The model raised or returned a wrong number of outputs",
    "503": "Model still loading",
}


_V2_ERRORS = {
    "400": "Malformed JSON; unknown input or output, wrong shape or datatype",
    "404": "Unknown model or version",
    "422": "A row fails the model's schema",
    "500": "The model raised or returned a wrong number of outputs",
    "503": "Model still loading",
}

_V2_TENSOR = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string", "enum": sorted(DATATYPES)},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "parameters": {"type": "object"},
        "data": {"description": "row-major, flat or nested; absent when binary data follows the JSON"},
    },
    "required": ["name", "datatype", "shape"],
}

_V2_SCHEMAS: dict[str, Any] = {
    "V2Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
    "V2Tensor": _V2_TENSOR,
    "V2InferenceRequest": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object"},
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/V2Tensor"}, "minItems": 1},
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
                    "required": ["name"],
                },
            },
        },
        "required": ["inputs"],
    },
    "V2InferenceResponse": {
        "type": "object",
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/V2Tensor"}},
        },
        "required": ["model_name", "outputs"],
    },
}


_WEBSOCKET = (
    "A WebSocket (async and hybrid architectures; sync answers 501 `websocket_unsupported`). Text messages "
    '`{"id", "instances"}` are answered with `{"id", "predictions"}` or `{"id", "error"}` as each is ready, in any '
    "order; binary messages are a 4-byte big-endian header length, a V2 inference request header and its tensor "
    "bytes, answered in the same framing. At most `--ws-max-pending` unanswered messages per socket "
    "(`too_many_pending` past it); close 1009 for a message over `--ws-max-message-bytes`, 1001 at shutdown."
)


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


#: Routes whose answers are not a plain JSON 200.
_GLOBAL_RESPONSES: dict[str, dict[str, Any]] = {
    "metrics": {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
    "ready": {"200": _json({}), "503": _json({}, "A model is still loading")},
}


def _jsonable(value: Any) -> Any:
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    try:
        return json_default(value)
    except TypeError:
        return value


def _tensors(title: str, tensors: list[dict[str, Any]]) -> str:
    return f"{title}: " + ", ".join(f"`{t['name']}` {t['datatype']} {t['shape']}" for t in tensors)


def _v2_paths(name: str, runtime: ModelRuntime, v2: V2Codec) -> dict[str, Any]:
    """The model's V2 metadata and infer paths, its tensors in the description, an example body if it has one."""
    errors = {code: _json({"$ref": _REF.format(model="V2Error")}, text) for code, text in _V2_ERRORS.items()}
    metadata = v2.metadata()
    body: dict[str, Any] = {"schema": {"$ref": _REF.format(model="V2InferenceRequest")}}
    example = v2.example(runtime.spec.examples())
    if example is not None:
        body["example"] = _jsonable(example)
    description = f"{_tensors('Inputs', metadata['inputs'])}. {_tensors('Outputs', metadata['outputs'])}."
    return {
        f"/v2/models/{name}": {
            "get": {"operationId": f"{name}_v2_metadata", "responses": {"200": _json({}), **errors}}
        },
        f"/v2/models/{name}/infer": {
            "post": {
                "operationId": f"{name}_infer",
                "summary": f"Infer with {name!r} (Open Inference Protocol)",
                "description": description,
                "requestBody": {"required": True, "content": {JSON: body}},
                "responses": {"200": _json({"$ref": _REF.format(model="V2InferenceResponse")}), **errors},
            }
        },
    }


def _stream_path(name: str, body: dict[str, Any], error_responses: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "operationId": f"{name}_stream",
            "summary": f"Stream the steps of {name!r} as Server-Sent Events",
            "description": 'Each step is an event `data: {"predictions": [one chunk per instance]}`; the stream '
            "ends with `event: end`, or with `event: error` carrying the JSON error body if it fails after its "
            "first step. Errors before the first step are answered with their status and a JSON body.",
            "requestBody": {"required": True, "content": {JSON: body}},
            "responses": {"200": {"description": "OK", "content": {EVENT_STREAM: {"schema": {"type": "string"}}}},
                          **error_responses},
        }
    }  # fmt: skip


def openapi_document(
    runtimes: Mapping[str, ModelRuntime], codecs: Mapping[str, ModelCodecs], title: str, version: str
) -> dict[str, Any]:
    schemas: dict[str, Any] = {"Error": _ERROR_SCHEMA, "V1Error": _V1_ERROR_SCHEMA, **_V2_SCHEMAS}
    error_responses = {code: _json({"$ref": _REF.format(model="V1Error")}, text) for code, text in _ERRORS.items()}
    paths: dict[str, Any] = {}
    for route in ROUTES:
        if "{model}" in route.path or route.name in ("openapi", "docs", *SWAGGER_ASSETS):
            continue
        responses = _GLOBAL_RESPONSES.get(route.name, {"200": _json({})})
        paths[route.path] = {route.method.lower(): {"operationId": route.name, "responses": responses}}
    for name, runtime in runtimes.items():
        codec = codecs[name].v1
        request_schema = codec.request_schema(_REF)
        output_schema = codec.output_adapter.json_schema(mode="serialization", ref_template=_REF)
        for part in (request_schema, output_schema):
            schemas.update(part.pop("$defs", {}))
        request_name = f"{name}_predict_request"
        schemas[request_name] = request_schema
        body: dict[str, Any] = {"schema": {"$ref": _REF.format(model=request_name)}}
        examples = runtime.spec.examples()
        if examples:
            body["example"] = {"instances": _jsonable(examples)}
        paths[f"/v1/models/{name}"] = {
            "get": {"operationId": f"{name}_metadata", "responses": {"200": _json({}), **error_responses}}
        }
        paths[f"/v1/models/{name}:predict"] = {
            "post": {
                "operationId": f"{name}_predict",
                "summary": f"Predict with {name!r}",
                "requestBody": {"required": True, "content": {JSON: body}},
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"predictions": {"type": "array", "items": output_schema}},
                        }
                    ),
                    **error_responses,
                },
            }
        }
        if runtime.spec.streams:
            paths[f"/v1/models/{name}:stream"] = _stream_path(name, body, error_responses)
        paths[f"/v1/models/{name}/ws"] = {
            "get": {
                "operationId": f"{name}_websocket",
                "summary": f"Stream predictions with {name!r} over a WebSocket",
                "description": _WEBSOCKET,
                "responses": {
                    "101": {"description": "Switching Protocols: the stream is open"},
                    "404": error_responses["404"],
                    "426": _json({"$ref": _REF.format(model="V1Error")}, "A plain GET, without the upgrade"),
                    "501": _json({"$ref": _REF.format(model="V1Error")}, "The sync architecture"),
                    "503": error_responses["503"],
                },
            }
        }
        paths.update(_v2_paths(name, runtime, codecs[name].v2))
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


#: API keys, either way they may be sent (README: "Authentication, CORS and limits").
SECURITY_SCHEMES: dict[str, Any] = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <API key>"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}


def secure(document: dict[str, Any], open_paths: frozenset[str]) -> dict[str, Any]:
    """`document` with its API-key security declared: on every operation but those on `open_paths`, with 401."""
    document["components"]["securitySchemes"] = SECURITY_SCHEMES
    document["security"] = [{"bearer": []}, {"apiKey": []}]
    for path, operations in document["paths"].items():
        body = _REF.format(model=_ERROR_SCHEMAS[error_shape(path)])
        for operation in operations.values():
            if path in open_paths:
                operation["security"] = []
            else:
                operation["responses"]["401"] = _json({"$ref": body}, "Missing or unknown API key")
    return document


_SWAGGER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<link rel="stylesheet" href="/docs/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({{url: "{url}", dom_id: "#swagger-ui"}});</script>
</body></html>
"""
#: The Swagger UI files the page loads, served from the `swagger-ui-bundle` package (no CDN: /docs works on a
#: machine without internet), by the asset's route name, with their media types.
SWAGGER_ASSETS = {
    "docs_css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "docs_js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
}


def swagger_page(openapi_url: str, title: str) -> bytes:
    """Swagger UI for the document at `openapi_url`; its assets are `swagger_asset`'s."""
    return _SWAGGER.format(title=title, url=openapi_url).encode()


@functools.cache
def swagger_asset(name: str) -> bytes:
    """The bytes of the Swagger UI file `SWAGGER_ASSETS[name]` names, read from its package once."""
    from swagger_ui_bundle import swagger_ui_path

    asset: bytes = (swagger_ui_path / SWAGGER_ASSETS[name][0]).read_bytes()
    return asset
