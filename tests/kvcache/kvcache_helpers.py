"""Helpers for the cache-brain tests: a fake clock and a ``put`` that allocates + inserts like an engine."""

from __future__ import annotations

from typing import Sequence

from backends.kvcache import InsertResult, KVCache


class FakeClock:
    """Injectable time for hint TTLs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def put(cache: KVCache, tokens: Sequence[int], agent=None, fixed: int | None = None) -> InsertResult:
    """Insert ``tokens`` the way an engine does: reuse matched device slots, allocate the rest."""
    adm = cache.admit(tokens)
    if adm.load is not None:
        cache.complete_load(adm.load)
    have = list(adm.match.device_slots) + list(adm.load.device_slots if adm.load else ())
    alloc = cache.alloc_device(len(tokens) - len(have))
    assert alloc.slots is not None, "test cache too small"
    res = cache.insert(tokens, have + list(alloc.slots), agent=agent, fixed_prefix_tokens=fixed)
    if res.offload is not None:
        cache.complete_offload(res.offload)
    cache.unlock(adm.match.last_node)
    cache.check_integrity()
    return res
