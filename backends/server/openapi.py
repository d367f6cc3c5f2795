"""``GET /openapi.json``: every route with its request body, the kvflow hint and the error shape.

The routes read their bodies themselves (strict pydantic models, errors in OpenAI's shape), so
FastAPI cannot see them; this module puts each body model's JSON schema on its route, documents
``custom_params.kvflow`` / ``sampling_params.custom_params.kvflow`` as :class:`KVFlowHint`, and gives
every operation a ``default`` response in the error shape.
"""

from __future__ import annotations

import warnings
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from backends.server.generate_routes import GenerateBody
from backends.server.openai_models import ChatCompletionRequest, CompletionRequest
from backends.server.responses_models import ResponsesRequest
from backends.server.responses_routes import RESPONSES_ROUTE
from kvflow_orch.protocol import KVFlowHint, StepsUpdate
from kvflow_orch.protocol.wire import STEPS_ROUTE

__all__ = ["install_openapi"]

_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    RESPONSES_ROUTE: ResponsesRequest,
    "/generate": GenerateBody,
    STEPS_ROUTE: StepsUpdate,
}
_STREAMING = frozenset({"/v1/chat/completions", "/v1/completions", RESPONSES_ROUTE, "/generate"})
_REF = "#/components/schemas/{model}"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
    }},
}


def _hint_container() -> dict[str, Any]:
    return {"anyOf": [{"type": "object", "properties": {"kvflow": {"$ref": _REF.format(model="KVFlowHint")}},
                       "additionalProperties": True}, {"type": "null"}]}


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF, mode="validation")
    components.update(schema.pop("$defs", {}))
    for sub in [schema, *components.values()]:
        if "custom_params" in sub.get("properties", {}):
            sub["properties"]["custom_params"] = _hint_container()
    return schema


def build_openapi(app: FastAPI) -> dict[str, Any]:
    with warnings.catch_warnings():  # GET and HEAD of one route share an operation id; HEAD is dropped below
        warnings.filterwarnings("ignore", message="Duplicate Operation ID")
        spec = get_openapi(title="kvflow", version=app.version, routes=app.routes,
                           description="OpenAI-compatible, SGLang /generate and kvflow routes of the embedded server.")
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    components["KVFlowHint"] = _schema(KVFlowHint, components)
    components["Error"] = _ERROR
    for path, operations in spec.get("paths", {}).items():
        operations.pop("head", None)  # implied by GET (RFC 9110); documenting it twice only adds noise
        for method, op in operations.items():
            ok: dict[str, Any] = {"application/json": {"schema": {}}}
            if path in _STREAMING:
                # Server-Sent Events: each event's ``data`` is one JSON chunk, the last one ``[DONE]``.
                ok["text/event-stream"] = {"schema": {"type": "object", "properties": {"data": {"type": "string"}}}}
            if path == "/metrics":
                ok = {"text/plain": {"schema": {"type": "string"}}}
            error = {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}
            op["responses"] = {"200": {"description": "OK", "content": ok},
                               "default": {"description": "Error", "content": error}}
            model = _BODIES.get(path)
            if model is not None and method == "post":
                components[model.__name__] = _schema(model, components)
                op["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}}
    return spec


def install_openapi(app: FastAPI) -> None:
    """Serve the document at ``/openapi.json`` (built once, on first request)."""
    cache: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not cache:
            cache.update(build_openapi(app))
        return cache

    app.openapi = openapi  # type: ignore[method-assign]

    @app.api_route("/openapi.json", include_in_schema=False, methods=["GET", "HEAD"])
    async def openapi_route() -> dict[str, Any]:
        return app.openapi()
