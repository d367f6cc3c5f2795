"""The eviction spec's adapter over the cache brain itself, driven with the verbs the embedded engine
and the simulator use (``accept``, ``reserve``, ``release``: :mod:`backends.kvcache.lifecycle`)."""

from __future__ import annotations

from typing import Sequence

from backends.kvcache import CacheConfig, KVCache
from backends.kvcache.intake import AgentRequest
from backends.kvcache.lifecycle import Refused
from eviction_spec import Setup
from kvflow_orch.protocol import KVFlowHint, StepsUpdate


class KVCacheSession:
    def __init__(self, setup: Setup, policy: str) -> None:
        self.cache = KVCache(CacheConfig(
            device_tokens=setup.device_tokens, host_tokens=setup.host_tokens, write_through=setup.host_tokens > 0,
            namespace_cap_tokens=setup.namespace_cap_tokens, policy=policy, prefetch=False))

    def request(self, tokens: Sequence[int], hint: KVFlowHint | None, fixed_tokens: int | None) -> None:
        cache = self.cache
        decision = cache.accept(AgentRequest(tokens, hint, fixed_tokens))
        reservation = cache.reserve(tokens, 1)  # one new token: the prompt is all it computes
        assert not isinstance(reservation, Refused), "scenario pool too small for one request"
        if reservation.load is not None:
            cache.complete_load(reservation.load)
        res = cache.release(reservation, tokens, decision)
        if res is not None and res.offload is not None:
            cache.complete_offload(res.offload)
        cache.check_integrity()

    def apply_steps(self, update: StepsUpdate) -> None:
        self.cache.apply_steps(update)

    def evict_host(self, tokens: int) -> None:
        self.cache.evict_host(tokens)

    def held(self, tokens: Sequence[int], *, any_tier: bool) -> int:
        match = self.cache.match_prefix(tokens)
        return match.cached_tokens if any_tier else match.device_tokens

    def close(self) -> None:
        self.cache.check_integrity()


class KVCacheHost:
    """``backends.kvcache.KVCache`` with ``policy`` (the spec runs ``kvflow``; other policies are
    how a test shows the spec can fail)."""

    lacks: dict[str, str] = {}
    diverges: dict[str, str] = {}

    def __init__(self, policy: str = "kvflow") -> None:
        self.policy = policy
        self.name = f"kvcache-{policy}"

    def open(self, setup: Setup) -> KVCacheSession:
        return KVCacheSession(setup, self.policy)
