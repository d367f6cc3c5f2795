"""Radix tree, slots, locks and insert/match semantics of the cache brain."""

from __future__ import annotations

import pytest

from backends.kvcache import (
    CacheError, LockError, NodeState, SlotAllocator, SlotError,
)

from kvcache_helpers import put


def test_allocator_hands_out_distinct_slots_and_rejects_double_free():
    pool = SlotAllocator(4, "device")
    a = pool.alloc(3)
    assert sorted(a) == [0, 1, 2] and pool.free_count == 1
    assert pool.alloc(2) is None and pool.free_count == 1
    pool.free(a[:1])
    with pytest.raises(SlotError, match="double free"):
        pool.free([a[0]])
    with pytest.raises(SlotError, match="out of range"):
        pool.free([7])
    with pytest.raises(SlotError):
        pool.free([a[1], a[1]])  # all-or-nothing: a[1] must still be taken
    assert not pool.is_free(a[1]) and pool.free_count == 2


def test_match_reports_device_prefix_and_splits_at_the_end(make_cache):
    cache = make_cache(device_tokens=32)
    put(cache, [1, 2, 3, 4, 5, 6])
    m = cache.match_prefix([1, 2, 3, 9])
    assert (m.device_tokens, m.host_tokens) == (3, 0)
    assert m.last_node.key == (1, 2, 3) and len(cache.tree) == 2  # split into [1,2,3] + [4,5,6]
    full = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert full.device_tokens == 6 and full.device_slots[:3] == m.device_slots
    cache.check_integrity()
    assert cache.match_prefix([]).device_tokens == 0
    assert cache.match_prefix([42]).last_node is cache.tree.root


def test_insert_frees_duplicate_slots_and_keeps_the_cache_copy(make_cache):
    cache = make_cache(device_tokens=16)
    first = put(cache, [1, 2, 3, 4])
    alloc = cache.alloc_device(6)
    res = cache.insert([1, 2, 3, 4, 7, 8], alloc.slots)
    assert res.new_tokens == 2
    assert set(res.duplicate_slots) == set(alloc.slots[:4])
    assert res.device_slots[:4] == first.device_slots
    assert cache.device.used_count == 6
    cache.check_integrity()


def test_insert_rejects_bad_slots_without_changing_anything(make_cache):
    cache = make_cache(device_tokens=16)
    put(cache, [1, 2, 3])
    before = (len(cache.tree), cache.device.free_count)
    with pytest.raises(CacheError, match="not held"):
        cache.insert([5, 6], [10, 11])  # never allocated
    with pytest.raises(CacheError, match="2 tokens but 1"):
        cache.insert([5, 6], [0])
    alloc = cache.alloc_device(2)
    with pytest.raises(CacheError, match="twice"):
        cache.insert([5, 6], [alloc.slots[0], alloc.slots[0]])
    assert (len(cache.tree), cache.device.free_count + 2) == before
    cache.free_device(alloc.slots)
    with pytest.raises(CacheError):
        cache.free_device(alloc.slots)  # not held any more
    assert cache.insert([], []).new_tokens == 0  # documented no-op
    cache.check_integrity()


def test_lock_protects_path_and_double_unlock_is_an_error(make_cache):
    cache = make_cache(device_tokens=8)
    put(cache, [1, 2, 3, 4])
    put(cache, [9, 9, 9, 9])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.lock(m.last_node)
    res = cache.evict_device(100)  # more than exists: frees what it can
    assert res.freed == 4 and res.dropped == 4
    assert cache.match_prefix([1, 2, 3, 4]).device_tokens == 4
    cache.unlock(m.last_node)
    with pytest.raises(LockError, match="double unlock"):
        cache.unlock(m.last_node)
    cache.check_integrity()
    assert cache.evict_device(4).freed == 4
    assert len(cache.tree) == 0
    cache.check_integrity()


def test_split_keeps_tags_states_and_locks(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=32)
    put(cache, [1, 2, 3, 4, 5, 6], agent=("ns", "a"), fixed=6)
    node = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    cache.lock(node)
    upper = cache.tree.split(node, 2)
    assert upper.tags == node.tags == {("ns", "a")}
    assert upper.lock_ref == node.lock_ref == 1
    assert upper.state is node.state is NodeState.DEVICE
    cache.unlock(node)
    cache.evict_device(6)
    assert upper.state is node.state is NodeState.HOST
    cache.check_integrity()


def test_states_through_demotion_load_and_write_through(make_cache):
    cache = make_cache(device_tokens=8, host_tokens=16, write_through=True)
    adm = cache.admit([1, 2, 3])
    alloc = cache.alloc_device(3)
    res = cache.insert([1, 2, 3], alloc.slots)
    node = res.last_node
    assert node.state is NodeState.OFFLOADING and res.offload.device_slots == tuple(alloc.slots)
    assert cache.evict_device(3).freed == 0  # in flight: never evicted
    cache.complete_offload(res.offload)
    cache.unlock(adm.match.last_node)
    assert node.state is NodeState.BOTH
    ev = cache.evict_device(3)
    assert ev.freed == 3 and ev.demoted == ()  # write-through: demotion is free
    assert node.state is NodeState.HOST
    adm = cache.admit([1, 2, 3, 4])
    assert adm.load.host_slots == tuple(node.host) and node.state is NodeState.LOADING
    assert not cache.is_ready(cache.match_prefix([1, 2, 3]))
    cache.complete_load(adm.load)
    assert node.state is NodeState.BOTH and cache.is_ready(cache.match_prefix([1, 2, 3]))
    cache.unlock(adm.match.last_node)
    cache.check_integrity()


def test_alloc_reports_shortage_instead_of_raising_and_keeps_demotions(make_cache):
    cache = make_cache(device_tokens=8, host_tokens=8)
    put(cache, [1, 2, 3, 4])
    put(cache, [5, 6, 7, 8])
    cache.lock(cache.match_prefix([5, 6, 7, 8]).last_node)
    alloc = cache.alloc_device(6)  # only 4 evictable: nothing handed out, eviction reported
    assert alloc.slots is None and alloc.evicted.freed == 4 and len(alloc.evicted.demoted) == 1
    assert cache.usage()["device_held"] == 0
    cache.check_integrity()


def test_fail_load_evicts_device_nodes_inserted_below_the_failed_load(make_cache):
    cache = make_cache(device_tokens=16, host_tokens=16)
    put(cache, [1, 2, 3, 4])
    cache.evict_device(4)
    adm = cache.admit([1, 2, 3, 4])
    alloc = cache.alloc_device(2)
    # A misbehaving engine inserts below the loading path before the copy finished.
    cache.insert([1, 2, 3, 4, 9, 9], list(adm.load.device_slots) + list(alloc.slots))
    result = cache.fail_load(adm.load)
    assert (result.freed, result.dropped) == (2, 2)  # [9, 9] was computed from garbage: dropped
    m = cache.match_prefix([1, 2, 3, 4, 9, 9])
    assert m.device_tokens == 0 and m.host_tokens == 4
    cache.unlock(adm.match.last_node)
    cache.check_integrity()
