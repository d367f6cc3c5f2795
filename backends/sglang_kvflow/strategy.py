"""The ``kvflow`` eviction strategy for SGLang's unified radix cache.

SGLang's eviction loops are min-heaps over ``get_priority(node)``: the smallest key goes first, for
device eviction and for host eviction alike (``FullComponent`` rebuilds its heap at every
``evict()``, so keys computed from the live hint table are always fresh). The key is exactly
``backends.kvcache.policy.kvflow_key`` over the node's agent tags, the hint table and SGLang's
``last_access_time``: the same order the embedded engine and the simulator use.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.evict_policy import EvictionStrategy

from backends.kvcache.policy import kvflow_key

from . import POLICY_NAME
from .state import PluginConfig, configure, get_state
from .tags import node_tags

__all__ = ["KVFlowStrategy", "POLICY_NAME"]


class KVFlowStrategy(EvictionStrategy):
    """Key = (tier, -steps, last access): untagged dynamic suffixes first, then prefixes of agents
    with no finite steps, then prefixes by descending steps-to-execution; LRU breaks ties.

    Constructed by SGLang as ``KVFlowStrategy(**radix_eviction_policy_config)``; the options are
    :class:`~backends.sglang_kvflow.state.PluginConfig` fields.
    """

    def __init__(self, **options: Any) -> None:
        configure(PluginConfig.from_options(options))

    def get_priority(self, node: Any) -> tuple[int, float, float]:
        return kvflow_key(node_tags(node), get_state().hints, node.last_access_time)
