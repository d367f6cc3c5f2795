"""Every failure the server reports, as OpenAI's JSON shape: ``{"error": {"message", "type", "param",
"code"}}``, ``code`` always a string, ``param`` the offending field (``null`` when none is to blame).

Routes raise :class:`APIError`; engine exceptions are translated by :func:`from_engine_error`; the
handlers installed by :func:`install_error_handlers` turn anything else (unknown route, wrong method,
an unexpected bug) into the same shape, so a client never has to parse HTML or a bare string.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from backends.base import ConstraintError, EngineError, RequestTooLarge
from kvflow_orch.protocol import HintError

__all__ = [
    "APIError",
    "ClientDisconnected",
    "error_body",
    "from_engine_error",
    "from_validation_error",
    "install_error_handlers",
    "send_error",
]

log = logging.getLogger("kvflow.server")

_HTTP_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error"}
_HTTP_CODES = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


class APIError(Exception):
    """A client-visible failure with its HTTP status and OpenAI-style ``type``/``code``."""

    def __init__(self, status: int, message: str, *, code: str, type: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type
        self.param = param

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.code, self.param), status_code=self.status)


class ClientDisconnected(Exception):
    """The client went away before the answer was ready; the request has been cancelled."""


def error_body(message: str, type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def send_error(send: Send, error: APIError) -> None:
    """Answer at the ASGI level (middlewares that reject before the router runs)."""
    body = json.dumps(error_body(error.message, error.type, error.code, error.param)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def from_validation_error(exc: ValidationError, *, prefix: str = "", status: int = 400) -> APIError:
    """A 400 (what OpenAI, vLLM and SGLang answer) whose message names every offending field
    (``messages.0.role: ...``) and whose ``param`` is the first of them."""
    parts, params = [], []
    for err in exc.errors(include_url=False):
        if err["type"] == "json_invalid":
            return APIError(400, f"request body is not valid JSON: {err['msg']}", code="invalid_json")
        loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        parts.append(f"{loc or 'body'}: {_message(err)}")
        params.append(loc or None)
    return APIError(status, "; ".join(parts), code="invalid_value", param=params[0] if params else None)


def _message(err: Any) -> str:
    if err["type"] == "finite_number":  # JSON's NaN / Infinity literals (Python's json writes them)
        value = err.get("input")
        return f"{'NaN' if value != value else value} is not allowed; send a finite number"
    return str(err["msg"]).removeprefix("Value error, ")


def from_engine_error(exc: Exception, *, prompt_field: str | None = None,
                      constraint_field: str | None = None) -> APIError:
    """``prompt_field``: the request's prompt field, named by a context-length error;
    ``constraint_field``: the field its constraint came from, named by a grammar error."""
    if isinstance(exc, ConstraintError):
        where = f"{constraint_field}: " if constraint_field else ""
        return APIError(400, f"{where}{exc}", code="unsupported_schema", param=constraint_field)
    if isinstance(exc, RequestTooLarge):
        # What OpenAI answers for a prompt (plus max_tokens) over the context: clients catch it as a 400.
        return APIError(400, str(exc), code="context_length_exceeded", param=prompt_field)
    if isinstance(exc, HintError):
        return APIError(400, str(exc), code="invalid_hint", param="custom_params.kvflow")
    if isinstance(exc, (EngineError, ValueError)):
        return APIError(400, str(exc), code="invalid_request")
    log.exception("request failed inside the engine", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error", type="server_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(ClientDisconnected)
    async def _client_gone(_: Request, exc: ClientDisconnected) -> Response:
        # Nobody reads this; 499 ("client closed request") makes the metrics say what happened.
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return JSONResponse(error_body(message, type_, code), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return from_engine_error(exc).response()
