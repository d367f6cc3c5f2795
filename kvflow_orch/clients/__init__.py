"""LLM backends for the runtime and how a ``backend=`` argument selects one.

``backend`` may be:

* ``"local"`` or ``"local:MODEL"`` — the embedded engine in this process (default model
  ``smollm2-135m``; MODEL may be ``tiny-random`` or a Hugging Face directory);
* a ``backends.local.EngineConfig`` — the embedded engine built from that config;
* a started engine object (implements ``backends.base.ServingEngine``) — used, never shut down;
* ``"http://HOST:PORT"`` — any kvflow or OpenAI-compatible server;
* an :class:`LLMClient` — used as is, never closed (share one across many runs).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .base import BackendError, LLMClient, LLMReply
from .http import HttpClient, HttpConfig
from .local import DEFAULT_MODEL, LocalClient

__all__ = [
    "LLMClient",
    "LLMReply",
    "BackendError",
    "HttpClient",
    "HttpConfig",
    "LocalClient",
    "DEFAULT_MODEL",
    "OpenedClient",
    "open_client",
]


class OpenedClient(NamedTuple):
    client: LLMClient
    owned: bool
    """True when the runtime created the client and must close it."""


def open_client(backend: Any) -> OpenedClient:
    """Turn a ``backend=`` argument into a client (see the module docstring for the forms)."""
    if isinstance(backend, LLMClient):
        return OpenedClient(backend, False)
    if isinstance(backend, str):
        if backend.startswith(("http://", "https://")):
            return OpenedClient(HttpClient(backend), True)
        if backend == "local" or backend.startswith("local:"):
            model = backend.partition(":")[2] or DEFAULT_MODEL
            return OpenedClient(LocalClient(model=model), True)
        raise ValueError(
            f"backend {backend!r} not understood: use 'local', 'local:MODEL', 'http://HOST:PORT', "
            f"an EngineConfig, an engine object or an LLMClient"
        )
    if hasattr(backend, "generate") and hasattr(backend, "apply_steps") and hasattr(backend, "tokenizer"):
        return OpenedClient(LocalClient(backend), True)  # the client is ours, the engine the caller's
    from backends.local import EngineConfig  # torch is imported only on this path

    if isinstance(backend, EngineConfig):
        return OpenedClient(LocalClient(config=backend), True)
    raise ValueError(f"backend of type {type(backend).__name__} not understood")
