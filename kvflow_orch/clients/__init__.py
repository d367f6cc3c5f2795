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
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .base import BackendError, LLMClient, LLMReply
from .gateway import GatewayClient, GatewayConfig
from .http import HttpClient, HttpConfig
from .local import DEFAULT_MODEL, LocalClient
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
    if isinstance(backend, tuple) and len(backend) == 2 and isinstance(backend[0], str):
        gateway, workers = backend
        if isinstance(workers, str) or not all(isinstance(w, str) for w in workers):
            raise ValueError("backend (GATEWAY_URL, WORKER_URLS): WORKER_URLS must be a list of URLs")
        return OpenedClient(GatewayClient(gateway, workers), True)
    if isinstance(backend, str):
        if backend.startswith(("smg+http://", "smg+https://")):
            return OpenedClient(GatewayClient(backend.removeprefix("smg+")), True)
        if backend.startswith(("http://", "https://")):
            return OpenedClient(HttpClient(backend), True)
        if backend == "local" or backend.startswith("local:"):
            model = backend.partition(":")[2] or DEFAULT_MODEL
            return OpenedClient(LocalClient(model=model), True)
        raise ValueError(
            f"backend {backend!r} not understood: use 'local', 'local:MODEL', 'http://HOST:PORT', 'smg+http://HOST:PORT', "
            f"an EngineConfig, an engine object or an LLMClient"
        )
    if hasattr(backend, "generate") and hasattr(backend, "apply_steps") and hasattr(backend, "tokenizer"):
        return OpenedClient(LocalClient(backend), True)  # the client is ours, the engine the caller's
    from backends.local import EngineConfig  # torch is imported only on this path

    if isinstance(backend, EngineConfig):
        return OpenedClient(LocalClient(config=backend), True)
    raise ValueError(f"backend of type {type(backend).__name__} not understood")
