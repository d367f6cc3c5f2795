"""Size limits on what a client may send, and the middleware that enforces the body size (413).

Limits on the *content* (``max_tokens``, message count, stop strings) are checked while parsing and
answered with 400 naming the field; hint limits (agents per steps map, name lengths) live in
:mod:`kvflow_orch.protocol` so every backend applies the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.server.errors import APIError, send_error

__all__ = ["ServerLimits", "BodySizeLimit"]


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body accepted; larger ones get 413 before they are parsed."""
    max_tokens: int = 32_768
    """Upper bound on ``max_tokens``/``max_new_tokens``; above it the request is rejected (400)."""
    max_messages: int = 1_024
    """Most chat messages in one request."""
    max_stop: int = 16
    """Most stop strings in one request."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens", "max_messages", "max_stop"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ServerLimits.{name} must be > 0")

    def body_too_large(self, size: int) -> APIError:
        return APIError(
            413,
            f"request body is {size} bytes or more; the limit is {self.max_body_bytes} bytes",
            code="body_too_large",
        )


class BodySizeLimit:
    """Rejects bodies over ``limits.max_body_bytes``: by ``Content-Length`` up front, and by counting
    the bytes actually received for chunked uploads (the route never sees the excess)."""

    def __init__(self, app: ASGIApp, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await send_error(send, self.limits.body_too_large(int(declared)))
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read; the APIError handler answers 413.
                    raise self.limits.body_too_large(received)
            return message

        await self.app(scope, counting_receive, send)
