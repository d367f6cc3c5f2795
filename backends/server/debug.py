"""Debug routes for operators and the load test: the cache brain's integrity check and the size of
its hint table. **Off by default**: only ``create_app(..., debug_routes=True)`` /
``kvflow serve --debug-routes`` mounts them, and they sit behind the API key like every other route.

* ``GET /kvflow/v1/debug/integrity`` -> ``{"ok": true, "locked_nodes": n}`` or ``{"ok": false,
  "error": "..."}``: runs ``KVCache.check_integrity()`` (slot ownership, lock counts, node states,
  leaf sets) and counts the locked nodes (0 once no request is running).
* ``GET /kvflow/v1/debug/hints`` -> ``{"workflows", "entries", "agents", "max_protected_tokens",
  "namespace_cap_tokens", "namespaces"}``: how many workflows, (workflow, agent) step entries and
  agents the hint table holds, and the most device tokens any one namespace protects right now.

Neither reveals a prompt, a workflow id, an agent or a namespace name: only counts. The work runs on
the engine's own loop thread (``engine.inspect_cache``), between scheduler steps, because the brain
is single-threaded; an engine without that hook answers 501.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol, TypeVar, runtime_checkable

from fastapi import APIRouter

from backends.server.errors import APIError
from backends.server.serving import ServerContext

__all__ = ["DEBUG_PREFIX", "INTEGRITY_ROUTE", "HINTS_ROUTE", "debug_router", "CacheInspector", "hint_summary"]

DEBUG_PREFIX = "/kvflow/v1/debug"
INTEGRITY_ROUTE = f"{DEBUG_PREFIX}/integrity"
HINTS_ROUTE = f"{DEBUG_PREFIX}/hints"

T = TypeVar("T")


@runtime_checkable
class CacheInspector(Protocol):
    """An engine that can run a read-only function on its cache brain, on the thread that owns it."""

    def inspect_cache(self, fn: Callable[[Any], T]) -> Awaitable[T]: ...


def _integrity(cache: Any) -> dict[str, Any]:
    try:
        cache.check_integrity()
    except Exception as exc:  # IntegrityError names the broken invariant; anything else is a bug too
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    # A lock nobody will release is consistent (so integrity passes) but pins KV forever: count them.
    return {"ok": True, "locked_nodes": sum(1 for node in cache.tree if node.lock_ref > 0)}


def hint_summary(cache: Any) -> dict[str, Any]:
    """Counts only (see the module docstring); ``cache`` is a ``backends.kvcache.KVCache``."""
    hints = cache.hints
    hints.expire()  # a TTL'd workflow is gone even if nothing has touched the table since
    agents = list(hints.agents())
    namespaces = {ref[0] for ref, _ in agents}
    protected = [hints.protected_tokens(ns) for ns in namespaces]
    return {
        "workflows": hints.workflow_count,
        "entries": hints.entry_count,
        "agents": len(agents),
        "namespaces": len(namespaces),
        "max_protected_tokens": max(protected, default=0),
        "namespace_cap_tokens": hints.cap_tokens,
    }


def debug_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    engine = ctx.engine

    async def inspect(fn: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        if not isinstance(engine, CacheInspector):
            raise APIError(501, f"engine {type(engine).__name__} cannot be inspected (no inspect_cache)",
                           code="not_implemented", type="server_error")
        return await engine.inspect_cache(fn)

    @router.api_route(INTEGRITY_ROUTE, methods=["GET", "HEAD"])
    async def integrity() -> dict[str, Any]:
        return await inspect(_integrity)

    @router.api_route(HINTS_ROUTE, methods=["GET", "HEAD"])
    async def hints() -> dict[str, Any]:
        return await inspect(hint_summary)

    return router
