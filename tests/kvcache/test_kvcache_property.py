"""Random op sequences with random hints: check_integrity after every step, counters monotonic,
and no slot ever leaks (pool occupancy returns to the tree's size once requests end)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.kvcache import CacheConfig, CacheError, KVCache, LockError
from kvflow_orch.protocol import StepsUpdate

from kvcache_helpers import FakeClock

AGENTS = ["a", "b", "c"]
# Agent-like prompts (shared system prefix, per-agent part, short random suffix) over a small
# alphabet, so that prefixes collide often and splits happen everywhere.
TEMPLATES = [(0, 1, 2, 3, 4, 5), (0, 1, 2, 7, 7, 7), (9, 9, 9, 9), ()]
tokens_st = st.builds(
    lambda template, cut, suffix: list(template[:cut]) + suffix,
    st.sampled_from(TEMPLATES), st.integers(0, 6), st.lists(st.integers(0, 3), max_size=4),
)
request_st = st.tuples(st.just("request"), tokens_st, st.sampled_from(AGENTS + [None]),
                       st.one_of(st.none(), st.integers(0, 8)), st.booleans())
ops_st = st.lists(
    st.one_of(
        request_st, request_st, request_st,
        st.tuples(st.just("steps"), st.dictionaries(st.sampled_from(AGENTS),
                                                    st.one_of(st.none(), st.integers(0, 4))),
                  st.integers(0, 5).map(lambda x: x == 0)),  # done: rarely
        st.tuples(st.just("evict_device"), st.integers(0, 20)),
        st.tuples(st.just("evict_one"), st.just(1)),
        st.tuples(st.just("evict_host"), st.integers(0, 20)),
        st.tuples(st.just("prefetch"), st.booleans()),
        st.tuples(st.just("finish_loads"), st.booleans()),
        st.tuples(st.just("time"), st.integers(0, 300)),
        st.tuples(st.just("end"), st.integers(0, 5)),
    ),
    min_size=25,
    max_size=80,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops_st,
    device=st.integers(4, 24),
    host=st.sampled_from([0, 6, 30]),
    policy=st.sampled_from(["lru", "kvflow"]),
    write_through=st.booleans(),
    cap=st.sampled_from([None, 100]),
)
def test_random_operations_keep_every_invariant(ops, device, host, policy, write_through, cap):
    clock = FakeClock()
    cache = KVCache(CacheConfig(device_tokens=device, host_tokens=host, policy=policy,
                                write_through=write_through, hint_ttl_s=1000,
                                namespace_cap_tokens=cap), clock=clock)
    running: list = []  # (locked node, slots still held by the "request")
    loads: list = []
    last_stats = cache.stats.as_dict()
    for op in ops:
        kind = op[0]
        if kind == "request":
            _, tokens, agent, fixed, keep = op
            m = cache.match_prefix(tokens)
            if not cache.is_ready(m):
                continue  # status-aware: skip requests whose prefix is loading
            adm = cache.admit(tokens)
            if adm.load is not None:
                cache.complete_load(adm.load)
            have = list(adm.match.device_slots) + list(adm.load.device_slots if adm.load else ())
            alloc = cache.alloc_device(len(tokens) - len(have))
            if alloc.slots is None:
                cache.unlock(adm.match.last_node)
            else:
                res = cache.insert(tokens, have + list(alloc.slots),
                                   agent=("ns", agent) if agent else None, fixed_prefix_tokens=fixed)
                if res.offload is not None:
                    (cache.complete_offload if keep else cache.fail_offload)(res.offload)
                cache.lock(res.last_node)
                cache.unlock(adm.match.last_node)
                running.append(res.last_node)
        elif kind == "steps":
            _, steps, done = op
            cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps=steps, done=done))
        elif kind == "evict_device":
            cache.evict_device(op[1])
        elif kind == "evict_one":
            # The lazy eviction queue must pick exactly the policy's minimum among evictable leaves.
            cache.hints.expire()
            keys = {n: cache.policy.key(n) for n in cache._device_leaves
                    if n.lock_ref == 0 and n.loading is None and n.offloading is None}
            cache.evict_device(1)
            victims = [n for n in keys if n.device is None]
            assert len(victims) == (1 if keys else 0)
            if keys:
                assert keys[victims[0]] == min(keys.values())
        elif kind == "evict_host":
            cache.evict_host(op[1])
        elif kind == "prefetch":
            loads.extend(cache.plan_prefetch().tasks)
        elif kind == "finish_loads":
            for task in loads:
                (cache.complete_load if op[1] else cache.fail_load)(task)
            loads.clear()
        elif kind == "time":
            clock.now += op[1]
        elif kind == "end" and running:
            node = running.pop(op[1] % len(running))
            cache.unlock(node)
        cache.check_integrity()
        stats = cache.stats.as_dict()
        assert all(stats[k] >= last_stats[k] for k in stats), "a counter went down"
        last_stats = stats
    for node in running:
        cache.unlock(node)
    for task in loads:
        cache.complete_load(task)
    try:
        cache.unlock(cache.tree.root)
        raise AssertionError("unlocking the root without a lock must fail")
    except LockError:
        pass
    cache.check_integrity()
    assert cache.usage()["device_held"] == 0
    cache.evict_device(10**6)
    cache.evict_host(10**6)
    cache.check_integrity()
    assert cache.device.used_count == 0 and cache.host.used_count == 0 and len(cache.tree) == 0


def test_bad_input_leaves_the_tree_intact():
    cache = KVCache(CacheConfig(device_tokens=8, host_tokens=8))
    alloc = cache.alloc_device(3)
    cache.insert([1, 2, 3], alloc.slots)
    for bad in (lambda: cache.insert([4], [99]), lambda: cache.alloc_device(-1),
                lambda: cache.insert([1, 2], alloc.slots), lambda: cache.evict_host(-3),
                lambda: cache.insert([5], [0], agent=("ns", "a"), fixed_prefix_tokens=-1)):
        try:
            bad()
            raise AssertionError("bad input accepted")
        except (CacheError, ValueError):
            pass
        cache.check_integrity()
    assert cache.match_prefix([1, 2, 3]).device_tokens == 3
