"""``KVCache.flush``: every node no request locks goes (both tiers), locked paths and transfers in
flight stay, the hint table stays, and every invariant holds after it."""

from __future__ import annotations

from kvflow_orch.protocol import KVFlowHint

from kvcache_helpers import put

SYS = (1, 2, 3, 4)


def test_flush_drops_everything_unlocked_on_both_tiers(make_cache) -> None:
    cache = make_cache(device_tokens=32, host_tokens=32)
    cache.apply_hint(KVFlowHint(workflow_id="w", namespace="ns", agent="A", steps={"A": 0, "B": 1}))
    put(cache, SYS + (10, 11, 12), agent=("ns", "A"), fixed=6)
    put(cache, SYS + (20, 21, 22), agent=("ns", "B"), fixed=6)
    cache.evict_device(3)  # some KV now lives on host only
    assert cache.usage()["host_used"] > 0
    device, host = cache.usage()["device_used"], cache.usage()["host_used"]
    result = cache.flush()
    assert cache.check_integrity()
    assert result.device_tokens == device and result.host_tokens == host and result.kept_tokens == 0
    usage = cache.usage()
    assert usage["device_used"] == usage["host_used"] == usage["nodes"] == 0
    assert cache.match_prefix(SYS + (10,)).cached_tokens == 0
    assert cache.hints.workflow_count == 1  # live workflows' steps are not cached KV
    put(cache, SYS + (10, 11, 12), agent=("ns", "A"), fixed=6)  # the cache works on after it
    assert cache.check_integrity() and cache.match_prefix(SYS + (10, 11)).cached_tokens == 6


def test_flush_keeps_a_locked_path_and_drops_its_unlocked_siblings(make_cache) -> None:
    cache = make_cache(device_tokens=32)
    held = put(cache, SYS + (10, 11))
    put(cache, SYS + (20, 21))
    put(cache, (7, 8, 9))
    cache.lock(held.last_node)
    result = cache.flush()
    assert cache.check_integrity()
    assert result.kept_tokens == 6 and result.device_tokens == 5
    assert cache.match_prefix(SYS + (10, 11)).cached_tokens == 6
    assert cache.match_prefix(SYS + (20, 21)).cached_tokens == 4  # only the locked shared prefix
    assert cache.match_prefix((7, 8, 9)).cached_tokens == 0
    cache.unlock(held.last_node)
    assert cache.flush().device_tokens == 6 and cache.usage()["device_used"] == 0
    assert cache.check_integrity()


def test_flush_of_an_empty_cache_frees_nothing(make_cache) -> None:
    cache = make_cache()
    assert tuple(cache.flush()) == (0, 0, 0, 0) and cache.check_integrity()
