"""Prefetch planner: load the fixed prefixes of agents about to run from host to device.

Rules (issue 3): after a hint update, every agent whose effective steps are <= the lookahead
(default 1; every branch candidate counts, most urgent first) and whose fixed prefix is (partly)
on host only gets a :class:`LoadTask`, within a budget: free device slots, plus device space whose
eviction removes nothing as urgent as that agent (only untagged nodes and nodes with larger
steps, in policy order), and at most ``max_inflight_loads`` prefetch tasks in flight. A prefix
already loading is skipped. The planned nodes are LOADING until ``complete_load``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .eviction import NO_EVICTION, merge_evictions
from .policy import node_steps
from .results import EvictResult, LoadTask

if TYPE_CHECKING:
    from .cache import KVCache

__all__ = ["PrefetchPlan", "plan_prefetch"]


class PrefetchPlan(NamedTuple):
    """Perform ``evicted.demoted`` copies first, then each task's copy, then ``complete_load``."""

    tasks: tuple[LoadTask, ...]
    evicted: EvictResult


EMPTY_PLAN = PrefetchPlan((), NO_EVICTION)


def plan_prefetch(cache: KVCache) -> PrefetchPlan:
    cfg = cache.config
    if not cfg.prefetch or not cfg.has_host_tier or cfg.max_inflight_loads == 0:
        return EMPTY_PLAN
    cache.hints.expire()
    in_flight = sum(1 for task, _ in cache._loads.values() if task.prefetch)
    if in_flight >= cfg.max_inflight_loads:
        return EMPTY_PLAN
    due = cache.hints.due(cfg.prefetch_lookahead)
    steps_of = cache.hints.steps
    tasks: list[LoadTask] = []
    evictions: list[EvictResult] = []
    for steps, ref in due:
        if in_flight >= cfg.max_inflight_loads:
            break
        fixed = cache.fixed_prefix(ref)
        if not fixed:
            continue
        match = cache.match_prefix(fixed)
        if not match.host_tokens or not cache.is_ready(match):
            continue
        need = match.host_tokens - cache.device.free_count
        if need > 0:
            victims, got = cache._victims(
                need, stop=lambda node, limit=steps: node_steps(node.tags, steps_of) <= limit)
            if got < need:
                continue  # would have to evict something at least as urgent: skip this agent
            evictions.append(cache._evict_nodes(victims))
        host_nodes = [node for node in match.nodes if node.device is None]
        task, evicted = cache._start_load(host_nodes, prefetch=True)
        evictions.append(evicted)
        if task is not None:
            tasks.append(task)
            in_flight += 1
    return PrefetchPlan(tuple(tasks), merge_evictions([e for e in evictions if e.freed or e.demoted]))
