"""Prefetch: load the fixed prefixes of agents that run soon from host to device, ahead of their
requests, with SGLang's own load-back path; and tell admission which requests must wait.

Runs AFTER ``Scheduler._process_hicache_events`` (acks of finished loads were just reaped, on every
TP rank alike, before admission). Each step:

1. retire prefetches whose anchor left ``cache.ongoing_load_back`` (the copy is acknowledged);
2. for agents with steps <= prefetch_lookahead, most urgent first, whose fixed prefix is (partly) host-only:
   ``load_back(anchor, mem_quota)`` then one ``ready_to_load_host_cache()`` to start the copies.

Bounds: at most ``max_inflight_loads`` prefetches; a load-back slot is used only while
``reserved_load_slots`` stay free for demand loads; ``mem_quota`` is the brain's prefetch budget
(:mod:`backends.kvcache.budget`: free device tokens, then device nodes in the kvflow eviction order
up to the first as urgent as the agent; eviction never removes something more urgent to make room
for a prefetch), read over SGLang's tree: its evictable device leaves in a heap, a parent joining
once its device children are taken, stopping at that bar or once the load's tokens are covered. A
step costs O(evictable leaves) when the free tokens do not cover the load, nothing more otherwise;
the whole-tree walk it replaces cost O(nodes) per candidate agent.

The trap: SGLang marks loaded tokens device-resident as soon as the load is queued. A request whose
matched path touches a node of an unacknowledged prefetch is therefore *not ready*
(:func:`is_ready`); the admission hook skips it until the ack.
"""

from __future__ import annotations

import heapq
import logging
import math
from contextlib import closing
from typing import Any, Iterator

from backends.kvcache.budget import prefetch_room
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


def load_quota(cache: Any, state: KVFlowState, ref: Any, need: float = math.inf) -> int:
    """Device tokens a prefetch for agent ``ref`` may take (the brain's budget rule): the free
    tokens, plus the tokens of device nodes SGLang would evict first, up to the first as urgent as
    the agent and no further than ``need`` tokens in all."""
    free = int(cache.token_to_kv_pool_allocator.available_size())
    if need <= free:
        return free
    with closing(_eviction_order(cache, state)) as order:
        _, room = prefetch_room(order, need - free, state.hints.steps(ref), size=_node_len, tags=node_tags,
                                steps_of=state.hints.steps)
    return free + room


def _eviction_order(cache: Any, state: KVFlowState) -> Iterator[Any]:
    """Unlocked device nodes in the order the kvflow strategy evicts them: SGLang's evictable device
    leaves by ``kvflow_key``, a parent joining once every child with device KV was taken."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    core = cache.tree_core

    def entry(node: Any) -> tuple[Any, int, Any]:
        return kvflow_key(node_tags(node), state.hints, node.last_access_time), id(node), node

    heap = [entry(node) for node in core.evictable_device_leaves]
    heapq.heapify(heap)
    taken: set[int] = set()
    while heap:
        node = heapq.heappop(heap)[2]
        yield node
        taken.add(id(node))
        parent = node.parent
        if (parent is not None and parent is not core.root_node and not parent.evicted
                and all(data.lock_ref == 0 for data in parent.component_data)
                and all(id(c) in taken or c.component_data[ComponentType.FULL].value is None
                        for c in parent.children.values())):
            heapq.heappush(heap, entry(parent))


def _node_len(node: Any) -> int:
    return len(node.key)


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
        # what load_back checks the quota against: the host tokens plus the path's device tokens it locks
        need = match.host_hit_length + match.device_prefix_len
        if not cache.load_back(anchor, mem_quota=load_quota(cache, state, ref, need)):
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
