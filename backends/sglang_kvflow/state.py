"""Per-process KVFlow state inside an SGLang scheduler: hint table, agent prefixes, in-flight
prefetches and counters.

One scheduler process owns one tree cache, so the state is a process-wide singleton. Every
tensor-parallel rank builds the same state because every update reaches it through the scheduler's
own input path (requests and registered messages are broadcast from rank 0), never a side channel.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from backends.kvcache.config import DEFAULT_HINT_TTL_S, namespace_cap
from backends.kvcache.hints import AgentRef, HintTable
from backends.kvcache.segment import Segmenter

__all__ = ["PluginConfig", "PrefixKey", "Inflight", "KVFlowState", "get_state", "configure", "reset_state", "COUNTERS"]

# Monotonic counters reported by GET /kvflow/v1/stats (names follow backends/kvcache's stats).
COUNTERS = (
    "hinted_requests",
    "steps_updates",
    "tagged_requests",
    "prefetch_issued",
    "prefetched_tokens",
    "prefetch_rejected",
    "admission_skips",
)


@dataclass(frozen=True)
class PluginConfig:
    """Plugin knobs; they arrive as ``--radix-eviction-policy-config`` JSON, so every scheduler
    process (and every TP rank) builds the same configuration from the server arguments. Knobs the
    brain also has carry :class:`~backends.kvcache.CacheConfig`'s names and meaning.

    * ``prefetch``: load fixed prefixes of agents within ``prefetch_lookahead`` steps ahead of
      their calls.
    * ``max_inflight_loads``: prefetch loads in flight at once.
    * ``reserved_load_slots``: load slots (SGLang has 3 layer-done counters) left for demand loads.
    * ``hint_ttl_s``: a workflow not updated for this long is forgotten (LRU order for its agents).
    * ``namespace_cap_tokens``: most fixed-prefix tokens one namespace may protect (None: half the
      device pool, as in backends/kvcache; applied once the scheduler knows its pool size).
    """

    prefetch: bool = True
    prefetch_lookahead: int = 1
    # The brain defaults to 4; SGLang tracks load-backs with 3 layer-done counters and
    # reserved_load_slots keeps one for demand loads, so at most 2 prefetches can be in flight.
    max_inflight_loads: int = 2
    reserved_load_slots: int = 1
    hint_ttl_s: float = DEFAULT_HINT_TTL_S
    namespace_cap_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prefetch_lookahead < 0 or self.max_inflight_loads < 0 or self.reserved_load_slots < 0:
            raise ValueError("prefetch_lookahead, max_inflight_loads and reserved_load_slots must be >= 0")
        if self.namespace_cap_tokens is not None and self.namespace_cap_tokens < 0:
            raise ValueError(f"namespace_cap_tokens must be >= 0, got {self.namespace_cap_tokens}")
        if not self.hint_ttl_s > 0:
            raise ValueError(f"hint_ttl_s must be > 0, got {self.hint_ttl_s}")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "PluginConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown kvflow policy option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**options)


class PrefixKey(NamedTuple):
    """Where an agent's fixed prefix lives in SGLang's tree (what a RadixKey is built from)."""

    token_ids: tuple[int, ...]
    extra_key: str | None
    cache_salt: str | None


class Inflight(NamedTuple):
    """One prefetch load: the anchor node SGLang tracks in ``ongoing_load_back``."""

    ref: AgentRef
    anchor_id: int
    tokens: int


class KVFlowState:
    """Everything the plugin keeps in one scheduler process. Not thread-safe: the scheduler loop
    is its only writer."""

    def __init__(self, config: PluginConfig | None = None) -> None:
        self.config = config or PluginConfig()
        self.hints = HintTable(ttl_s=self.config.hint_ttl_s, cap_tokens=self.config.namespace_cap_tokens)
        self.segmenter = Segmenter()
        self.prefixes: OrderedDict[AgentRef, PrefixKey] = OrderedDict()
        # Token bound of the prefix table, as the segmentation history's (a client that names
        # many agents with long explicit prefixes would otherwise hold agents x context tokens).
        self.max_prefix_tokens = self.segmenter.max_tokens
        self._prefix_tokens = 0
        self.inflight: dict[int, Inflight] = {}
        self.counters: Counter[str] = Counter({name: 0 for name in COUNTERS})

    def use_device_pool(self, device_tokens: int) -> None:
        """The scheduler's device pool size is known: apply the brain's default namespace cap
        (:func:`~backends.kvcache.config.namespace_cap`) unless the options set one."""
        if self.config.namespace_cap_tokens is None:
            self.hints.set_cap(namespace_cap(None, device_tokens))

    def remember_prefix(self, ref: AgentRef, prefix: PrefixKey) -> None:
        """Where ``ref``'s fixed prefix lives (for prefetch); bounded in agents like the hint table
        and in tokens like the segmentation history, the least recently tagged agent forgotten
        first (the newest always stays)."""
        old = self.prefixes.pop(ref, None)
        if old is not None:
            self._prefix_tokens -= len(old.token_ids)
        self.prefixes[ref] = prefix
        self._prefix_tokens += len(prefix.token_ids)
        while len(self.prefixes) > 1 and (len(self.prefixes) > self.hints.max_agents
                                          or self._prefix_tokens > self.max_prefix_tokens):
            _, gone = self.prefixes.popitem(last=False)
            self._prefix_tokens -= len(gone.token_ids)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view for /kvflow/v1/stats (no prompts, no workflow ids)."""
        return {
            "counters": dict(self.counters),
            "workflows": self.hints.workflow_count,
            "agents_with_prefix": len(self.prefixes),
            "prefetch_inflight": len(self.inflight),
            "config": asdict(self.config),
        }

    def agents_due(self) -> list[tuple[float, AgentRef]]:
        """Agents with a tagged fixed prefix within the prefetch lookahead, most urgent first
        (the hint table's own candidate list: O(agents with a prefix), not O(agents named))."""
        self.hints.expire()
        return self.hints.due(self.config.prefetch_lookahead)


_STATE = KVFlowState()


def get_state() -> KVFlowState:
    return _STATE


def configure(config: PluginConfig) -> KVFlowState:
    """Use ``config``: keeps the current state when the configuration is unchanged (SGLang builds
    the strategy once per tree), else starts a fresh one."""
    global _STATE
    if config != _STATE.config:
        _STATE = KVFlowState(config)
    return _STATE


def reset_state(config: PluginConfig | None = None) -> KVFlowState:
    """Start from an empty state (tests isolate themselves with it)."""
    global _STATE
    _STATE = KVFlowState(config)
    return _STATE
