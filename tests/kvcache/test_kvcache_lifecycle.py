"""The request life cycle (reserve / release) the embedded engine and the simulator share."""

from __future__ import annotations

import pytest

from backends.kvcache import UNHINTED, CacheError, IntakeDecision, Refused, Reservation
from kvflow_orch.protocol import StepsUpdate

from kvcache_helpers import put

PROMPT = list(range(100, 120))  # 20 tokens


def run(cache, prompt, outputs, intake=UNHINTED) -> Reservation:
    """Reserve, 'compute' every position, release with the computed tokens."""
    r = cache.reserve(prompt, len(outputs))
    assert isinstance(r, Reservation)
    if r.load is not None:
        cache.complete_load(r.load)
    computed = (list(prompt) + list(outputs))[: len(prompt) + len(outputs) - 1]
    res = cache.release(r, computed, intake)
    if res is not None and res.offload is not None:
        cache.complete_offload(res.offload)
    cache.check_integrity()
    return r


def test_a_request_reserves_every_token_it_computes_and_gives_back_all_it_did_not_insert(make_cache):
    cache = make_cache(device_tokens=64)
    r = cache.reserve(PROMPT, 5)
    assert r.reused == 0 and len(r.own_slots) == 20 + 5 - 1  # the last output token's KV is never computed
    assert cache.device.used_count == 24
    cache.release(r, PROMPT + [1, 2], IntakeDecision(("ns", "a"), 8))  # stopped after 3 outputs
    assert cache.device.used_count == 22 and not cache._held  # the rest came back
    assert cache.fixed_prefix(("ns", "a")) == tuple(PROMPT[:8])
    assert all(node.lock_ref == 0 for node in cache.tree)
    cache.check_integrity()


def test_a_cached_prompt_reuses_all_but_its_last_token(make_cache):
    cache = make_cache(device_tokens=64)
    run(cache, PROMPT, [1, 2])
    r = cache.reserve(PROMPT, 3)
    assert r.reused == 19 and r.prefix_slots == cache.match_prefix(PROMPT).device_slots[:19]
    assert len(r.own_slots) == 1 + 3 - 1 and r.slots(21)[:19] == r.prefix_slots
    cache.release(r, None)  # cancelled before any work: nothing inserted, every slot back
    assert cache.device.used_count == 21 and all(node.lock_ref == 0 for node in cache.tree)
    cache.check_integrity()


def test_a_request_that_cannot_get_its_room_counts_nothing_and_loads_nothing(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=64)
    run(cache, PROMPT, [1])
    cache.evict_device(10**6)  # the prompt is host-only now
    blocker = cache.reserve(list(range(500, 510)), 10)  # 19 slots held by a running request
    before = cache.stats.as_dict()
    refused = cache.reserve(PROMPT + [7], 4)  # needs 20 host tokens to load + 4 computed > 13 free
    assert isinstance(refused, Refused) and not refused.loading
    assert cache.stats.as_dict() == before  # no hit, no miss counted, nothing loaded
    assert cache.match_prefix(PROMPT).host_tokens == 20 and all(n.loading is None for n in cache.tree)
    assert all(node.lock_ref == 0 for node in cache.match_prefix(PROMPT).nodes)
    cache.release(blocker, None)
    r = cache.reserve(PROMPT + [7], 4)  # now it fits: the host part is loaded into the room made
    assert isinstance(r, Reservation) and r.load is not None and r.load.tokens == 20 and r.reused == 20
    assert cache.stats.host_hit_tokens - before["host_hit_tokens"] == 20
    cache.complete_load(r.load)
    cache.release(r, PROMPT + [7, 1, 2, 3])
    cache.check_integrity()


def test_a_prompt_whose_prefix_is_still_loading_is_refused_as_loading(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=64)
    put(cache, PROMPT[:8], agent=("ns", "a"), fixed=8)
    cache.evict_device(10**6)
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"a": 0}))
    plan = cache.plan_prefetch()
    assert len(plan.tasks) == 1
    before = cache.stats.as_dict()
    refused = cache.reserve(PROMPT, 2)
    assert refused == Refused(True, refused.evicted) and cache.stats.as_dict() == before
    cache.complete_load(plan.tasks[0])
    r = cache.reserve(PROMPT, 2)
    assert isinstance(r, Reservation) and cache.stats.prefetch_hit_tokens == 8
    cache.release(r, PROMPT + [1])
    cache.check_integrity()


def test_release_gives_slots_and_lock_back_even_when_the_insert_is_refused(make_cache):
    cache = make_cache(device_tokens=64)
    r = cache.reserve(PROMPT, 4)
    with pytest.raises(CacheError, match="cannot insert 30 tokens"):
        cache.release(r, list(range(30)))
    assert cache.device.used_count == 0 and all(node.lock_ref == 0 for node in cache.tree)
    with pytest.raises(CacheError, match="cannot reserve"):
        cache.reserve([], 1)
    cache.check_integrity()
