"""Prefetch: load the fixed prefixes of agents that run soon from host to device, ahead of their
requests, with SGLang's own load-back path; and tell admission which requests must wait.

Runs AFTER ``Scheduler._process_hicache_events`` (acks of finished loads were just reaped, on every
TP rank alike, before admission). Each step:

1. retire prefetches whose anchor left ``cache.ongoing_load_back`` (the copy is acknowledged);
2. for agents with steps <= prefetch_lookahead, most urgent first, whose fixed prefix is (partly) host-only:
   ``load_back(anchor, mem_quota)`` then one ``ready_to_load_host_cache()`` to start the copies.

Bounds: at most ``max_inflight_loads`` prefetches; a load-back slot is used only while
``reserved_load_slots`` stay free for demand loads; ``mem_quota`` = free device tokens plus the
unlocked device tokens whose eviction key is below the agent's (eviction never removes something
more urgent to make room for a prefetch).

The trap: SGLang marks loaded tokens device-resident as soon as the load is queued. A request whose
matched path touches a node of an unacknowledged prefetch is therefore *not ready*
(:func:`is_ready`); the admission hook skips it until the ack.
"""

from __future__ import annotations

import logging
from typing import Any

from backends.kvcache.policy import kvflow_key

from .state import Inflight, KVFlowState, get_state
from .tags import LOADING_ATTR, node_tags, prefix_radix_key, uses_python_core

__all__ = ["after_hicache_events", "prefetch_step", "retire_finished", "is_ready", "load_quota"]

logger = logging.getLogger(__name__)


def retire_finished(cache: Any, state: KVFlowState) -> int:
    """Forget prefetches SGLang has acknowledged; returns how many finished."""
    done = [anchor for anchor in state.inflight if anchor not in cache.ongoing_load_back]
    for anchor in done:
        state.counters["prefetched_tokens"] += state.inflight.pop(anchor).tokens
    return len(done)


def is_ready(cache: Any, node_id: Any, state: KVFlowState | None = None) -> bool:
    """False while any node on root..node belongs to an unacknowledged prefetch."""
    state = state or get_state()
    if not state.inflight or node_id is None or not uses_python_core(cache):
        return True
    core = cache.tree_core
    node = core.node_by_id(node_id) if not hasattr(node_id, "parent") else node_id
    while node is not None and node is not core.root_node:
        if getattr(node, LOADING_ATTR, None) in state.inflight:
            return False
        node = node.parent
    return True


def load_quota(cache: Any, state: KVFlowState, ref: Any) -> int:
    """Device tokens a prefetch for agent ``ref`` may take: free tokens plus unlocked,
    device-resident tokens that rank below the agent's own prefix in eviction order."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    bar = kvflow_key({ref}, state.hints, float("inf"))[:2]
    quota = int(cache.token_to_kv_pool_allocator.available_size())
    stack = list(cache.tree_core.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        full = node.component_data[ComponentType.FULL]
        if full.value is None or full.lock_ref > 0:
            continue
        if kvflow_key(node_tags(node), state.hints, node.last_access_time)[:2] < bar:
            quota += len(node.key)
    return quota


def _slot_free(cache: Any, state: KVFlowState) -> bool:
    controller = cache.cache_controller
    used = len(controller.ack_load_queue)
    return used + state.config.reserved_load_slots < controller.layer_done_counter.num_counters


def _host_only_path(core: Any, anchor_id: Any) -> list[Any]:
    nodes = []
    node = core.node_by_id(anchor_id)
    while node is not None and node is not core.root_node and node.evicted:
        nodes.append(node)
        node = node.parent
    return nodes


def _match_quietly(cache: Any, key: Any) -> Any:
    """``cache.match_prefix(key)`` without its side effect on recency: SGLang stamps every node on
    the matched path as just used, and looking at a prefix to prefetch it is no use of it (LRU
    order among equally hinted nodes must not change). A node the match splits off keeps the time
    of the node it was split from."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    core = cache.tree_core
    before: dict[int, tuple[Any, float]] = {}
    node, offset = core.root_node, 0
    while offset < len(key):
        child = node.children.get(key.child_key_at(offset, cache.page_size))
        if child is None:
            break
        before[id(child)] = (child, child.last_access_time)
        matched = child.key.match_at(key, offset, page_size=cache.page_size)
        if matched < len(child.key):
            break
        node, offset = child, offset + matched
    match = cache.match_prefix(MatchPrefixParams(key=key))
    for old, stamp in before.values():
        old.last_access_time = stamp
        upper = old.parent
        if upper is not None and id(upper) not in before and upper is not core.root_node:
            upper.last_access_time = stamp  # split off ``old`` by this match
    return match


def prefetch_step(cache: Any, state: KVFlowState | None = None) -> int:
    """One scheduler iteration of prefetching; returns how many loads it started."""
    state = state or get_state()
    retire_finished(cache, state)
    if not state.config.cache.prefetch or state.config.cache.max_inflight_loads == 0:
        return 0
    started = 0
    core = cache.tree_core
    for steps, ref, prefix in state.intake.due(state.config.cache.prefetch_lookahead):
        if len(state.inflight) >= state.config.cache.max_inflight_loads or not _slot_free(cache, state):
            break
        match = _match_quietly(cache, prefix_radix_key(cache, prefix))
        if match.host_hit_length <= 0:
            continue
        anchor = match.best_match_node
        if anchor in cache.ongoing_load_back:
            continue  # a demand load of the same prefix is already on its way
        to_load = _host_only_path(core, anchor)
        if not cache.load_back(anchor, mem_quota=load_quota(cache, state, ref)):
            state.counters["prefetch_rejected"] += 1
            continue
        for node in to_load:
            setattr(node, LOADING_ATTR, anchor)
        state.inflight[anchor] = Inflight(ref, anchor, int(match.host_hit_length))
        state.counters["prefetch_issued"] += 1
        logger.debug("kvflow prefetch: %s/%s at steps %s, %d host tokens", *ref, steps, match.host_hit_length)
        started += 1
    if started:
        cache.ready_to_load_host_cache()
    return started


def after_hicache_events(result: Any, scheduler: Any, *_: Any, **__: Any) -> None:
    """AFTER ``Scheduler._process_hicache_events``."""
    cache = getattr(scheduler, "tree_cache", None)
    if cache is None or getattr(cache, "cache_controller", None) is None or not uses_python_core(cache):
        return None
    prefetch_step(cache)
    return None
