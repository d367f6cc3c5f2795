"""API-key check in front of every route except ``/health`` (load balancers probe it unauthenticated).

The key is accepted as ``Authorization: Bearer KEY`` (what OpenAI clients send) or ``X-API-Key: KEY``;
comparison is constant-time. The check runs before the body is read, so an unauthenticated client
cannot make the server parse anything.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from backends.server.errors import APIError, send_error

__all__ = ["APIKeyAuth", "PUBLIC_PATHS", "key_problem"]

PUBLIC_PATHS = frozenset({"/health"})


def key_problem(api_key: str) -> str | None:
    """Why ``api_key`` cannot guard a server (``None``: it can). An empty key, or one of spaces,
    matches no ``Authorization`` header (its value is stripped), so every request would be refused."""
    if not api_key.strip():
        return "the API key is empty; give a non-empty key, or none to serve without one"
    if api_key != api_key.strip():
        return "the API key starts or ends with whitespace, which no client can send; remove it"
    return None


class APIKeyAuth:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        problem = key_problem(api_key)
        if problem is not None:
            raise ValueError(problem)
        self.app = app
        self._key = api_key.encode()

    def _presented(self, scope: Scope) -> bytes | None:
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            return auth[7:].strip()
        return headers.get(b"x-api-key")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        presented = self._presented(scope)
        if presented is None or not hmac.compare_digest(presented, self._key):
            reason = "missing API key" if presented is None else "invalid API key"
            await send_error(
                send,
                APIError(401, f"{reason}: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                         type="authentication_error"),
            )
            return
        await self.app(scope, receive, send)
