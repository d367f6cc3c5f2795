"""What GET /kvflow/v1/stats reports: the plugin's counters plus the tree cache's occupancy, one
block per DP rank, summed by the HTTP side (counters and token counts add up)."""

from __future__ import annotations

from typing import Any, Iterable

from .state import KVFlowState

__all__ = ["scheduler_stats", "merge_stats"]


def _safe_int(fn: Any) -> int | None:
    try:
        value = fn()
    except Exception:  # an optional pool that this configuration lacks
        return None
    return int(value[0] if isinstance(value, tuple) else value)


def scheduler_stats(scheduler: Any, state: KVFlowState) -> dict[str, Any]:
    """Runs in the scheduler process (answering a KVFlowStatsReq)."""
    out = state.snapshot()
    cache = getattr(scheduler, "tree_cache", None)
    allocator = getattr(scheduler, "token_to_kv_pool_allocator", None)
    device = {
        "capacity_tokens": getattr(scheduler, "max_total_num_tokens", None),
        "free_tokens": _safe_int(allocator.available_size) if allocator is not None else None,
        "evictable_tokens": _safe_int(cache.evictable_size) if cache is not None else None,
        "protected_tokens": _safe_int(cache.protected_size) if cache is not None else None,
    }
    out["device"] = device
    host_pool = getattr(getattr(cache, "cache_controller", None), "mem_pool_host", None)
    if host_pool is not None:
        out["host"] = {
            "capacity_tokens": getattr(host_pool, "size", None),
            "free_tokens": _safe_int(host_pool.available_size) if hasattr(host_pool, "available_size") else None,
        }
    return out


def _add(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            current = into.get(key)
            into[key] = value if not isinstance(current, (int, float)) else current + value
        else:
            into.setdefault(key, value)


def merge_stats(replies: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sum the per-rank blocks (the plugin configuration is the same on every rank)."""
    replies = list(replies)
    merged: dict[str, Any] = {"ranks": len(replies)}
    for reply in replies:
        config = reply.get("config")
        _add(merged, {k: v for k, v in reply.items() if k != "config"})
        if config is not None:
            merged.setdefault("config", config)
    return merged
