"""``KVFlowScheduler``: vLLM's scheduler with the brain's eviction order on its prefix cache.

vLLM evicts a cached block when ``BlockPool.get_new_blocks`` pops it from the head of the free
queue; stock ``free_blocks`` appends hashed blocks at the tail (LRU). This subclass keeps the queue
as ``[unhashed | untagged, LRU | tagged, in kvflow_key order]``: after every free, and whenever a
hint or steps update changes steps, the free blocks of tagged prefixes are moved behind the others
in the brain's order (``kvflow_key``: untagged first, then agents not expected again, then by
descending steps-to-execution; LRU within a tie). Blocks in use are never touched.

Continuations (:mod:`.state`): a request of a session concludes its turn before its blocks are freed
(so a kept conversation is tagged as it joins the free queue); the ``pause`` verb keeps one after
a reply that called tools; deadlines are swept before each step, and the blocks of an expired
conversation go to the head of the free queue (evicted first, as LRU would: they were last used
before the pause). A request that returns to a kept conversation whose blocks are still cached
(half its prompt at least) goes to the front of the waiting queue, unless a request it would
overtake was passed over :data:`~backends.kvcache.lifecycle.MAX_PASSED` times already.

Hints come from ``Request.kv_transfer_params["kvflow"]`` (the endpoint plugin also moves
``custom_params.kvflow`` there); steps updates and stats arrive through the ``kvflow_call``
utility (:mod:`.plugin`). Options: the ``KVFLOW_VLLM_CONFIG`` JSON object holds
:class:`~backends.kvcache.CacheConfig` fields (``device_tokens`` is always the real pool's).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from vllm.v1.core.kv_cache_utils import get_block_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from backends.kvcache.intake import IntakeDecision
from backends.kvcache.lifecycle import admission_order, passed_over
from kvflow_orch.protocol import DEFAULT_NAMESPACE, MAX_NAME_LEN, StepsUpdate, check_resume_in_s

from . import POLICY_NAME, UTILITY
from .state import KVFlowState, cache_config_from_env, set_current_state

__all__ = ["KVFlowScheduler", "cache_config_from_env", "install_pool_hooks", "reorder_free_queue"]

logger = logging.getLogger(__name__)

_GROUP = [0]  # the single full-attention KV cache group of the models this targets
EXPIRE_EVERY_S = 0.1  # how often deadlines are swept (before a step); a deadline has a 1 s grace


def install_pool_hooks(pool: Any, state: KVFlowState, reorder: Callable[[], int]) -> None:
    """Wrap ``pool``'s free path (stamp freed tagged blocks, then ``reorder``) and its eviction
    (count evicted tokens). The stock methods still do all of the pool's own work."""
    stock_free, stock_evict = pool.free_blocks, pool._maybe_evict_cached_block

    def free_blocks(ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        stock_free(blocks)
        freed = False
        for block in blocks:
            if block.ref_cnt == 0 and block.block_hash is not None:
                state.note_freed(get_block_hash(block.block_hash))
                freed = True
        if freed:
            reorder()

    def maybe_evict(block: Any) -> bool:
        evicted = stock_evict(block)
        if evicted:
            state.stats.evicted_device_tokens += state.block_size
        return evicted

    pool.free_blocks = free_blocks
    pool._maybe_evict_cached_block = maybe_evict


def reorder_free_queue(pool: Any, state: KVFlowState) -> int:
    """Move every free block of a tagged prefix to the tail of ``pool``'s free queue, in the
    brain's eviction order (so untagged blocks are evicted before any of them); returns how many
    moved. O(tagged blocks)."""
    queue = pool.free_block_queue
    loose = [blocks[0] for h in state.take_loose()
             if (blocks := pool.get_cached_block(h, _GROUP)) and blocks[0].ref_cnt == 0 and not blocks[0].is_null]
    if loose:  # an expired conversation: its blocks were last used before the pause
        for block in loose:
            queue.remove(block)
        queue.prepend_n(loose)
    if not state.tags:
        return 0
    free_tagged = []
    for block_hash in state.tags:
        blocks = pool.get_cached_block(block_hash, _GROUP)
        if blocks and blocks[0].ref_cnt == 0 and not blocks[0].is_null:
            free_tagged.append((block_hash, blocks[0]))
    if not free_tagged:
        return 0
    ordered = state.order(free_tagged)
    for block in ordered:
        queue.remove(block)
    queue.append_n(ordered)
    state.counters["reorders"] += 1
    return len(ordered)


class KVFlowScheduler(Scheduler):
    """``--scheduler-cls backends.vllm_kvflow.scheduler.KVFlowScheduler``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        manager = self.kv_cache_manager
        pool = manager.block_pool
        self._pool = pool
        hash_size = getattr(self, "hash_block_size", None) or self.block_size
        self._active = pool.enable_caching and len(self.kv_cache_config.kv_cache_groups) == 1 \
            and hash_size == self.block_size
        if not self._active:
            logger.warning("kvflow: prefix caching off, several KV cache groups or hash block size %s != block "
                           "size %s: the free queue keeps vLLM's LRU order", hash_size, self.block_size)
        usable = (pool.num_gpu_blocks - 1) * self.block_size  # block 0 is vLLM's null block
        self.kvflow = KVFlowState(cache_config_from_env(usable), self.block_size)
        set_current_state(self.kvflow)
        self._counted: set[str] = set()
        self._sessions: dict[str, IntakeDecision] = {}  # request id -> decision, for requests of a session
        self._passed: dict[str, int] = {}  # request id -> times a returning continuation went ahead of it
        self._swept = 0.0
        install_pool_hooks(pool, self.kvflow, self.reorder)
        logger.info("kvflow: workflow-aware free queue on %d blocks of %d tokens (namespace cap %d tokens)",
                    pool.num_gpu_blocks - 1, self.block_size, self.kvflow.config.effective_namespace_cap)

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        new = request.request_id not in self.requests
        super().add_request(request)
        if new and request.prompt_token_ids is not None:
            decision = self.kvflow.accept(request.kv_transfer_params, request.prompt_token_ids, request.block_hashes)
            if decision.session is not None:
                self._sessions[request.request_id] = decision
            if decision.resumes and self._resident(request):
                self._admit_first(request)
            if decision.agent is not None or self.kvflow.loose:
                self.reorder()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now - self._swept >= EXPIRE_EVERY_S:
            self._swept = now
            if self.kvflow.expire():
                self.reorder()
        return super().schedule(*args, **kwargs)

    def _resident(self, request: Any) -> bool:
        """Whether half the request's prompt at least is cached in the pool (leading full blocks)."""
        cached = 0
        for block_hash in request.block_hashes:
            if self._pool.get_cached_block(block_hash, _GROUP) is None:
                break
            cached += self.block_size
        return 2 * cached >= request.num_prompt_tokens

    def _admit_first(self, request: Any) -> None:
        """Move a returning continuation to the front of the waiting queue (program-level order),
        in the brain's admission order: not while a request it would overtake was passed over
        MAX_PASSED times already, so the others' wait stays bounded."""
        waiting = self.waiting
        if request not in waiting:
            return
        queue = list(waiting)
        order = admission_order(queue, lambda r: r is request, lambda r: self._passed.get(r.request_id, 0))
        if order[0] is not request or queue[0] is request:
            return
        for r in passed_over(queue, request):
            self._passed[r.request_id] = self._passed.get(r.request_id, 0) + 1
        waiting.remove_request(request)
        waiting.prepend_request(request)
        self.kvflow.counters["continuations_admitted_first"] += 1

    def _get_local_prefix_cache_hit(self, request: Any) -> Any:
        result = super()._get_local_prefix_cache_hit(request)
        if request.request_id not in self._counted:  # once per request, not per scheduling attempt
            self._counted.add(request.request_id)
            hit = min(result[1], request.num_prompt_tokens)
            self.kvflow.stats.device_hit_tokens += hit
            self.kvflow.stats.recomputed_tokens += request.num_prompt_tokens - hit
        return result

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._counted.discard(request.request_id)
        self._passed.pop(request.request_id, None)
        decision = self._sessions.pop(request.request_id, None)
        if decision is not None and request.status != RequestStatus.FINISHED_ABORTED:
            # before the blocks are freed: a kept conversation joins the free queue tagged
            self.kvflow.conclude(decision, request.block_hashes)
        return super()._free_request(request, *args, **kwargs)

    # ---- order -------------------------------------------------------------------------------
    def reorder(self) -> int:
        """Put the tagged free blocks in the brain's order (see :func:`reorder_free_queue`)."""
        if not self._active:
            return 0
        return reorder_free_queue(self._pool, self.kvflow)

    # ---- the utility the API server calls ----------------------------------------------------
    def kvflow_call(self, verb: str, payload: Any = None) -> dict[str, Any]:
        """``steps`` (payload: a StepsUpdate as JSON), ``pause`` (payload: ``{"session": [namespace,
        key], "tools": [names], "resume_in_s": s | null}``), ``stats`` or ``info``. Raises ValueError
        on an unknown verb or a malformed payload (the routes validated it already)."""
        if verb == "pause":
            session, tools, resume_in_s = _pause_payload(payload)
            kept = self.kvflow.pause(session, tools, resume_in_s)
            if kept:
                self.reorder()
            return {"ok": True, "kept": kept}
        if verb == "steps":
            self.kvflow.apply_steps(StepsUpdate.model_validate(payload))
            self.reorder()
            return {"ok": True}
        if verb == "stats":
            return {"policy": POLICY_NAME, "free_blocks": self._pool.get_num_free_blocks(),
                    **self.kvflow.snapshot()}
        if verb == "info":
            return {"policy": POLICY_NAME, "block_size": self.block_size,
                    "device_tokens": self.kvflow.config.device_tokens, "active": self._active}
        raise ValueError(f"unknown kvflow verb {verb!r}; known: steps, pause, stats, info")


def _pause_payload(payload: Any) -> tuple[tuple[str, str], list[str], float | None]:
    """The ``pause`` verb's payload, checked (ValueError naming the problem)."""
    if not isinstance(payload, dict):
        raise ValueError("pause needs an object payload")
    session, tools = payload.get("session"), payload.get("tools", [])
    if not (isinstance(session, (list, tuple)) and len(session) == 2
            and all(isinstance(part, str) and 0 < len(part) <= 2 * MAX_NAME_LEN + 1 for part in session)):
        raise ValueError(f"pause: session must be [namespace, key] (non-empty names), got {session!r}")
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ValueError(f"pause: tools must be a list of names, got {tools!r}")
    return (session[0] or DEFAULT_NAMESPACE, session[1]), tools, check_resume_in_s(payload.get("resume_in_s"))


# Named so the general plugin can recognise the scheduler without importing this module.
setattr(KVFlowScheduler, UTILITY, KVFlowScheduler.kvflow_call)
