"""LLM backends for the runtime and how a ``backend=`` argument selects one.

``backend`` may be:

* ``"local"`` or ``"local:MODEL"`` — the embedded engine in this process (default model
  ``smollm2-135m``; MODEL may be ``tiny-random`` or a Hugging Face directory);
* a ``backends.local.EngineConfig`` — the embedded engine built from that config;
* a started engine object (implements ``backends.base.ServingEngine``) — used, never shut down;
* ``"http://HOST:PORT"`` — any kvflow or OpenAI-compatible server;
* ``"smg+http://HOST:PORT"`` — kvflow workers behind a gateway (SGLang's ``smg``), the workers read
  from the gateway's worker list; ``("http://GATEWAY", ["http://WORKER", ...])`` names them
  (:class:`GatewayClient`; build one yourself for ``routing="agent"`` and other options);
* an :class:`LLMClient` — used as is, never closed (share one across many runs).

Every form but the last is a backend of :mod:`.registry`, registered by the module of its client
(:func:`register_backend` adds one).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .base import BackendError, LLMClient, LLMReply
from .gateway import GatewayClient, GatewayConfig
from .http import HttpClient, HttpConfig
from .local import DEFAULT_MODEL, LocalClient
from .probe import PlainServerWarning
from .registry import backend_names, open_backend, register_backend
from .steps_router import StepsRouter

__all__ = [
    "LLMClient",
    "LLMReply",
    "BackendError",
    "HttpClient",
    "HttpConfig",
    "GatewayClient",
    "GatewayConfig",
    "StepsRouter",
    "LocalClient",
    "DEFAULT_MODEL",
    "PlainServerWarning",
    "OpenedClient",
    "open_client",
    "register_backend",
    "backend_names",
]


class OpenedClient(NamedTuple):
    client: LLMClient
    owned: bool
    """True when the runtime created the client and must close it."""


def open_client(backend: Any) -> OpenedClient:
    """Turn a ``backend=`` argument into a client (see the module docstring for the forms)."""
    if isinstance(backend, LLMClient):
        return OpenedClient(backend, False)
    return OpenedClient(open_backend(backend), True)
