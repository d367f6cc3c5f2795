"""The cache brain: a two-tier radix KV cache with workflow-aware eviction, hints and prefetch.

Pure Python (no torch, no device): it manages slot *indices*; the engine owns the tensors and
performs the copies that results report (:class:`Demotion`, :class:`LoadTask`,
:class:`OffloadTask`). What every host needs stands on its own for the plugins, which keep their
own trees: the request intake (:class:`RequestIntake`: hint table, fixed-boundary rule, agent
registry, counters), :func:`kvflow_key`, the prefetch budget (:mod:`.budget`) and
:meth:`CacheConfig.from_options`.
"""

from __future__ import annotations

from .allocator import SlotAllocator
from .bounded import BoundedLRU
from .cache import KVCache
from .config import DEFAULT_HINT_TTL_S, CacheConfig, namespace_cap
from .errors import CacheError, IntegrityError, LockError, SlotError, UnknownTaskError
from .hints import INF, AgentRef, HintError, HintTable
from .intake import INTAKE_COUNTERS, UNHINTED, AgentRequest, IntakeDecision, RequestIntake
from .continuations import CONTINUATION_COUNTERS, Continuation, SessionRef, ToolDurations
from .lifecycle import MAX_PASSED, Refused, Reservation, admission_order, passed_over
from .prefixes import AgentPrefixes
from .policy import (
    TIER_HINTED, TIER_UNHINTED, TIER_UNTAGGED, BeladyPolicy, EvictionPolicy, KVFlowPolicy, LRUPolicy,
    kvflow_key, make_policy, node_steps, policy_names, register_policy,
)
from .radix import Node, NodeState, RadixTree, salted_key
from .results import (
    NO_EVICTION, Admission, Allocation, Demotion, EvictResult, FlushResult, InsertResult, LoadTask, LockHandle,
    MatchResult, OffloadTask, PrefetchPlan, merge_evictions,
)
from .segment import Segmenter, common_prefix_len
from .stats import CacheStats

__all__ = [
    "KVCache", "CacheConfig", "DEFAULT_HINT_TTL_S", "namespace_cap",
    "MatchResult", "InsertResult", "Demotion", "EvictResult", "LoadTask", "OffloadTask",
    "Allocation", "Admission", "PrefetchPlan", "LockHandle", "NO_EVICTION", "FlushResult", "merge_evictions",
    "Reservation", "Refused", "admission_order", "passed_over", "MAX_PASSED",
    "Continuation", "SessionRef", "ToolDurations", "CONTINUATION_COUNTERS",
    "RequestIntake", "AgentRequest", "IntakeDecision", "UNHINTED", "INTAKE_COUNTERS", "AgentPrefixes", "BoundedLRU",
    "HintTable", "AgentRef", "HintError", "INF",
    "EvictionPolicy", "LRUPolicy", "KVFlowPolicy", "BeladyPolicy", "kvflow_key", "node_steps",
    "TIER_UNTAGGED", "TIER_UNHINTED", "TIER_HINTED", "register_policy", "make_policy", "policy_names",
    "Segmenter", "common_prefix_len", "CacheStats", "SlotAllocator",
    "Node", "NodeState", "RadixTree", "salted_key",
    "CacheError", "LockError", "UnknownTaskError", "IntegrityError", "SlotError",
]
