"""Defences of a server on loopback against the web pages its user opens.

A browser lets any page send a *simple* request (``text/plain``, form or multipart body, no custom
header) to any address, the loopback one included, without asking the server first; and a page
whose domain the attacker re-points at 127.0.0.1 (DNS rebinding) may even read the replies. Two
checks close both doors before any body is read:

* :class:`JSONBodiesOnly`: a POST with a body must say ``Content-Type: application/json`` (415
  otherwise). A page can only send JSON after a CORS preflight, which this server never grants.
  A POST without a body and without a Content-Type (what a gateway fans out to ``/flush_cache``)
  still passes: the Origin check below is what keeps pages from sending it.
* :class:`HostCheck`: the ``Host`` header must name one of the allowed hosts (a rebound domain
  names the attacker's), and a request with an ``Origin`` header (every cross-origin request a
  browser sends but a plain GET) must come from an allowed host, or from the server itself (403
  otherwise). ``allowed_hosts=None`` lets any Host through and accepts only same-host origins:
  what a server bound to a public address, whose names it cannot know, still gets.
"""

from __future__ import annotations

from typing import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from backends.server.errors import APIError, send_error

__all__ = ["LOOPBACK_HOSTS", "JSONBodiesOnly", "HostCheck", "host_name", "host_names"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names a client on this machine reaches a loopback server by (``kvflow serve``'s default)."""
_JSON = b"application/json"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class JSONBodiesOnly:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _BODY_METHODS:
            problem = _not_json(scope)
            if problem is not None:
                await send_error(send, APIError(415, f"{problem}; send the body as JSON with "
                                                "'Content-Type: application/json'", code="unsupported_media_type",
                                                param="Content-Type"))
                return
        await self.app(scope, receive, send)


def _not_json(scope: Scope) -> str | None:
    content_type = _header(scope, b"content-type")
    if content_type is None:
        length = _header(scope, b"content-length")
        chunked = _header(scope, b"transfer-encoding") is not None
        if chunked or (length is not None and length.strip() not in (b"", b"0")):
            return "the request has a body but no Content-Type"
        return None
    media_type = content_type.split(b";", 1)[0].strip().lower()
    if media_type != _JSON:
        return f"Content-Type {media_type.decode('latin-1')[:100]!r} is not accepted"
    return None


def host_name(value: str) -> str:
    """The host part of a ``Host`` header (``[::1]:30000`` -> ``::1``, ``Localhost.`` -> ``localhost``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def host_names(allowed_hosts: Iterable[str] | None) -> frozenset[str] | None:
    """``allowed_hosts`` as :class:`HostCheck` compares them; ValueError for an empty name or none."""
    if allowed_hosts is None:
        return None
    names = frozenset(host_name(h) for h in allowed_hosts)
    if not names or not all(names):
        raise ValueError(f"allowed hosts must be non-empty names, got {sorted(names)}")
    return names


class HostCheck:
    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] | None) -> None:
        self.app = app
        self.allowed = host_names(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is not None:
            await send_error(send, APIError(403, problem, code="forbidden_host", type="permission_error"))
            return
        await self.app(scope, receive, send)

    def _problem(self, scope: Scope) -> str | None:
        raw_host = _header(scope, b"host")
        host = host_name(raw_host.decode("latin-1")) if raw_host is not None else ""
        if self.allowed is not None and host not in self.allowed:
            return (f"Host {host[:100]!r} is not served here (a rebound DNS name?); this server answers "
                    f"{', '.join(sorted(self.allowed))} (kvflow serve --allowed-hosts)")
        raw_origin = _header(scope, b"origin")
        if raw_origin is None:
            return None
        origin = raw_origin.decode("latin-1")
        try:
            parts = urlsplit(origin)
            origin_host = (parts.hostname or "") if parts.scheme in ("http", "https") else ""
        except ValueError:
            origin_host = ""
        if origin_host and (origin_host in self.allowed if self.allowed is not None else origin_host == host):
            return None
        return (f"requests from web pages of Origin {origin[:100]!r} are refused (cross-site); "
                "allow its host with kvflow serve --allowed-hosts")
