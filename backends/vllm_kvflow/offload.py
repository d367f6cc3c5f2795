"""The host tier's eviction order for CUDA users: vLLM's CPU offloading tier (``OffloadingConnector``,
``--kv-offloading-size``) with the brain's order instead of LRU.

vLLM picks the tier's ``CachePolicy`` by name from ``kv_connector_extra_config``
(``eviction_policy`` + ``cache_policy_module_path``); the launcher passes
``KVFlowCachePolicy`` from this module with ``--policy kvflow --host-tokens M``. The policy keeps
vLLM's LRU bookkeeping and changes one decision: which evictable chunks go first — by
``kvflow_key`` over the tags the :class:`~backends.vllm_kvflow.scheduler.KVFlowScheduler` of the
same process recorded for the chunk's block hash, LRU rank within a tie.

What vLLM does not allow: loading a prefix before a request for it exists. Host-to-device loads
start only when the scheduler matches a request (``get_num_new_matched_tokens``), so the next
agents' prefixes are kept on the host tier by this order, not prefetched. vLLM refuses the tier on
CPU-only machines; only loading this class and its order are tested there.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import get_offload_block_hash
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from .state import current_state

__all__ = ["KVFlowCachePolicy", "POLICY_CLASS", "MODULE"]

POLICY_CLASS = "KVFlowCachePolicy"
MODULE = __name__


class KVFlowCachePolicy(LRUCachePolicy):
    """LRU's structures, kvflow's eviction choice (falls back to LRU without a kvflow scheduler)."""

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        state = current_state()
        if state is None or not state.tags or n == 0:
            return super().evict(n, protected)
        candidates = [key for key in self._evictable if key not in protected]
        if len(candidates) < n:
            return None
        state.hints.expire()
        candidates.sort(key=lambda key: (state.key(get_offload_block_hash(key)), self._ranks[key]))
        chosen = []
        for key in candidates[:n]:
            chunk = self.chunks.pop(key)
            self._ranks.pop(key, None)
            self._evictable.discard(key)
            chosen.append((key, chunk))
        state.stats.evicted_host_tokens += n * state.block_size
        self._maybe_compact_heap()
        return chosen
