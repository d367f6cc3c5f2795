"""Per-process KVFlow state inside an SGLang scheduler: the brain's request intake (hint table,
segmentation, agent registry, counters) on a message clock, in-flight prefetches, and the plugin's
own counters.

One scheduler process owns one tree cache, so the state is a process-wide singleton. Every
tensor-parallel rank builds the same state because every update reaches it through the scheduler's
own input path (requests and registered messages are broadcast from rank 0), never a side channel,
and hints expire by the stamps those messages carry (:class:`MessageClock`), never a rank's clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from backends.kvcache.config import CacheConfig
from backends.kvcache.hints import AgentRef, HintTable
from backends.kvcache.intake import INTAKE_COUNTERS, RequestIntake

__all__ = ["PluginConfig", "MessageClock", "UNSIZED_POOL", "PrefixKey", "Inflight", "KVFlowState", "get_state",
           "configure", "reset_state", "COUNTERS"]

# Monotonic counters reported by GET /kvflow/v1/stats: the intake's, then the plugin's own.
PLUGIN_COUNTERS = ("prefetch_issued", "prefetched_tokens", "prefetch_rejected", "admission_skips",
                   "continuations_admitted_first")
COUNTERS = INTAKE_COUNTERS + PLUGIN_COUNTERS


# CacheConfig needs a device pool size, which a scheduler learns only once it has built its pools
# (KVFlowState.use_device_pool); until then the nested config carries this placeholder.
UNSIZED_POOL = 1
# Options that are brain knobs: they go to the nested CacheConfig under the same names.
CACHE_OPTIONS = ("prefetch", "prefetch_lookahead", "max_inflight_loads", "hint_ttl_s", "namespace_cap_tokens",
                 "continuations", "tool_default_s", "tool_cold_hold_s", "step_default_s", "continuation_max_s")
PLUGIN_OPTIONS = ("reserved_load_slots",)  # the plugin's own


def _plugin_cache_config() -> CacheConfig:
    # The brain defaults to 4 loads in flight; SGLang tracks load-backs with 3 layer-done counters
    # and reserved_load_slots keeps one for demand loads, so at most 2 prefetches can be in flight.
    return CacheConfig(device_tokens=UNSIZED_POOL, max_inflight_loads=2)


@dataclass(frozen=True)
class PluginConfig:
    """Plugin knobs; they arrive as ``--radix-eviction-policy-config`` JSON, so every scheduler
    process (and every TP rank) builds the same configuration from the server arguments.

    * ``cache``: the brain's :class:`~backends.kvcache.CacheConfig` (validated there). The options
      :data:`CACHE_OPTIONS` (``prefetch``, ``prefetch_lookahead``, ``max_inflight_loads``,
      ``hint_ttl_s``, ``namespace_cap_tokens``, and the continuations' ``continuations``,
      ``tool_default_s``, ``tool_cold_hold_s``, ``step_default_s``, ``continuation_max_s``) set its fields
      of the same names;
      ``device_tokens`` is :data:`UNSIZED_POOL` until the scheduler knows its pool (:meth:`sized`), so the default
      namespace cap (half the device pool) applies from then on.
    * ``reserved_load_slots``: load slots (SGLang has 3 layer-done counters) left for demand loads.
    """

    cache: CacheConfig = field(default_factory=_plugin_cache_config)
    reserved_load_slots: int = 1

    def __post_init__(self) -> None:
        if self.reserved_load_slots < 0:
            raise ValueError(f"reserved_load_slots must be >= 0, got {self.reserved_load_slots}")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "PluginConfig":
        """Raises ValueError naming an unknown option or a bad value."""
        cache = CacheConfig.from_options(options, base=_plugin_cache_config(), accepted=CACHE_OPTIONS + PLUGIN_OPTIONS,
                                         label="kvflow policy option")
        return cls(cache=cache, **{k: v for k, v in options.items() if k in PLUGIN_OPTIONS})

    def sized(self, device_tokens: int) -> "PluginConfig":
        """This configuration with the scheduler's device pool size filled in."""
        return replace(self, cache=replace(self.cache, device_tokens=device_tokens))

    def as_options(self) -> dict[str, Any]:
        """The options that build this configuration (what /kvflow/v1/stats reports)."""
        return {**{name: getattr(self.cache, name) for name in CACHE_OPTIONS},
                "reserved_load_slots": self.reserved_load_slots}


class MessageClock:
    """Time as carried by the scheduler's input messages: the latest ``sent_at`` stamp seen.

    The HTTP side stamps every hinted request and steps update once, and every TP rank receives the
    same messages in the same order, so every rank's hint table expires the same workflows at the
    same message, whatever each rank's own clock says. Stamps never move the clock back."""

    def __init__(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def advance(self, stamp: float | None) -> None:
        if stamp is not None and stamp > self._now:
            self._now = float(stamp)


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
    """What the plugin keeps in one scheduler process: the brain's :class:`RequestIntake` (its
    agent registry records where each agent's tagged prefix lives, a :class:`PrefixKey`), the
    clock it expires hints by, and the prefetches in flight. Not thread-safe: the scheduler loop
    is its only writer."""

    def __init__(self, config: PluginConfig | None = None) -> None:
        self.options = config or PluginConfig()  # as configured; ``config`` gets the pool size
        self.config = self.options
        self.clock = MessageClock()
        self.intake: RequestIntake[PrefixKey] = RequestIntake(self.config.cache, clock=self.clock.now)
        # No pool to take half of yet: only a configured cap applies until use_device_pool.
        self.intake.hints.set_cap(self.config.cache.namespace_cap_tokens)
        self.inflight: dict[int, Inflight] = {}
        # continuation tag changes decided without a tree at hand (.tags.retag applies them next)
        self.pending_retags: list[tuple[list[Any], Any]] = []
        self.counters: Counter[str] = self.intake.counters  # one table: the intake's names, then ours
        self.counters.update({name: 0 for name in PLUGIN_COUNTERS})

    @property
    def hints(self) -> HintTable:
        return self.intake.hints

    def use_device_pool(self, device_tokens: int) -> None:
        """The scheduler's device pool size is known: size the nested CacheConfig, whose namespace
        cap (:func:`~backends.kvcache.config.namespace_cap`: the option, else half the pool) and
        token bounds the intake then applies."""
        self.config = self.options.sized(device_tokens)
        self.intake.size_for(self.config.cache)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view for /kvflow/v1/stats (no prompts, no workflow ids)."""
        return {**self.intake.snapshot(), "prefetch_inflight": len(self.inflight), "config": self.config.as_options()}


_STATE = KVFlowState()


def get_state() -> KVFlowState:
    return _STATE


def configure(config: PluginConfig) -> KVFlowState:
    """Use ``config``: keeps the current state when the configuration is unchanged (SGLang builds
    the strategy once per tree), else starts a fresh one."""
    global _STATE
    if config != _STATE.options:
        _STATE = KVFlowState(config)
    return _STATE


def reset_state(config: PluginConfig | None = None) -> KVFlowState:
    """Start from an empty state (tests isolate themselves with it)."""
    global _STATE
    _STATE = KVFlowState(config)
    return _STATE
