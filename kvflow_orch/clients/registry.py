"""The registry of backends: which client a ``backend=`` argument opens.

A backend is registered under a name: ``backend="NAME"`` or ``"NAME:..."`` opens it (a URL's
scheme is its name, so ``"http://..."`` opens the ``http`` backend), and so does an object its
``accepts`` predicate recognises (the embedded engine's ``EngineConfig``). Each client module
registers its own forms where it is defined (``local``, ``http``/``https``, ``smg+http``/``smg+https``
and the ``(GATEWAY_URL, WORKER_URLS)`` pair), so the dispatcher names none of them; a new backend
is one :func:`register_backend` call, as a new eviction policy is one ``register_policy``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from .base import LLMClient

__all__ = ["register_backend", "open_backend", "backend_names"]


class _Entry(NamedTuple):
    factory: Callable[[Any], LLMClient]
    accepts: Callable[[Any], bool] | None


_BACKENDS: dict[str, _Entry] = {}


def register_backend(name: str, factory: Callable[[Any], LLMClient], *,
                     accepts: Callable[[Any], bool] | None = None) -> None:
    """Add a backend: ``factory(backend)`` returns a client for ``backend`` (the whole ``"NAME..."``
    string, or an object ``accepts(obj)`` is true for) that the runtime then owns and closes."""
    if not name or ":" in name or name in _BACKENDS:
        raise ValueError(f"backend name {name!r} is empty, has a ':' or is already registered")
    _BACKENDS[name] = _Entry(factory, accepts)


def open_backend(backend: Any) -> LLMClient:
    """A new client for ``backend``; ValueError naming the known backends when none takes it."""
    if isinstance(backend, str):
        entry = _BACKENDS.get(backend.partition(":")[0])
        if entry is not None:
            return entry.factory(backend)
        what = f"backend {backend!r}"
    else:
        for entry in _BACKENDS.values():
            if entry.accepts is not None and entry.accepts(backend):
                return entry.factory(backend)
        what = f"backend of type {type(backend).__name__}"
    raise ValueError(
        f"{what} not understood: use 'local', 'local:MODEL', 'http://HOST:PORT', 'smg+http://HOST:PORT', "
        f"(GATEWAY_URL, WORKER_URLS), an EngineConfig, an engine object or an LLMClient "
        f"(known backend names: {', '.join(backend_names())})"
    )


def backend_names() -> list[str]:
    """The registered backend names."""
    return sorted(_BACKENDS)
