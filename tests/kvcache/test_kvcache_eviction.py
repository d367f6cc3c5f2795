"""Eviction mechanics on hand-built trees: the key function, tiers, locks, the policies' registry,
TTL expiry. The kvflow order itself is the eviction spec's (tests/conformance/test_eviction_order.py),
which the brain, SGLang's radix cache and vLLM's block pool run from one table of scenarios."""

from __future__ import annotations

import math

import pytest

from backends.kvcache import (
    TIER_HINTED, TIER_UNHINTED, TIER_UNTAGGED, BeladyPolicy, CacheConfig, CacheError, HintTable,
    KVCache, NodeState, kvflow_key, make_policy, policy_names,
)
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from kvcache_helpers import put

SYS = (1, 2, 3, 4)          # system prompt shared by every agent
FIXED = {"A": SYS + (10, 11), "B": SYS + (20, 21), "C": SYS + (30, 31)}


def build_workflow(cache: KVCache) -> dict[str, tuple[int, ...]]:
    """Three agents sharing SYS, each fixed prefix followed by a 2-token dynamic suffix."""
    suffix = {}
    for i, (agent, fixed) in enumerate(FIXED.items()):
        tokens = fixed + (100 + i, 200 + i)
        put(cache, tokens, agent=("ns", agent), fixed=len(fixed))
        suffix[agent] = tokens
    return suffix


def evict_order(cache: KVCache) -> list[tuple[int, ...]]:
    """Evict one node at a time; the key of each evicted node's full path, in order."""
    order = []
    while True:
        leaves = {n: cache.tree.path_to(n) for n in cache._device_leaves}
        res = cache.evict_device(1)
        cache.check_integrity()
        if not res.freed:
            return order
        gone = [n for n in leaves if n.device is None]
        assert len(gone) == 1
        order.append(tuple(t for p in leaves[gone[0]] for t in p.key))


def test_shared_node_is_tagged_by_every_agent_and_keys_on_their_min(make_cache):
    cache = make_cache(device_tokens=64)
    build_workflow(cache)
    sys_node = cache.match_prefix(SYS).last_node
    assert sys_node.tags == {("ns", a) for a in "ABC"}
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"A": 5, "B": 3, "C": 4}))
    assert kvflow_key(sys_node.tags, cache.hints, 0)[:2] == (TIER_HINTED, -3)
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"A": 5, "B": None, "C": 4}))
    assert kvflow_key(sys_node.tags, cache.hints, 0)[:2] == (TIER_HINTED, -4)


def test_infinite_steps_rank_after_untagged_before_finite():
    hints = HintTable()
    hints.set_steps("ns", "w", {"far": None, "near": 7})
    untagged = kvflow_key(set(), hints, last_access=99)
    unhinted = kvflow_key({("ns", "far")}, hints, last_access=1)
    unknown = kvflow_key({("ns", "nobody")}, hints, last_access=1)
    hinted = kvflow_key({("ns", "near")}, hints, last_access=0)
    assert untagged[0] == TIER_UNTAGGED and unhinted[0] == unknown[0] == TIER_UNHINTED
    assert untagged < unhinted < hinted
    ties = sorted([kvflow_key({("ns", "near")}, hints, t) for t in (5, 3, 4)])
    assert [k[-1] for k in ties] == [3, 4, 5]  # equal steps: least recently used first


def test_equal_steps_across_workflows_evict_the_workflow_that_advanced_last():
    """paper_x2 on vLLM: two 4-agent cycles in flight. app1 started s00 (its s03 is 3 steps away),
    then app0 started s01 (its just-finished s00 is 3 steps away too). app1 reaches its s03 first,
    so app0's s00 goes first although it was used more recently (LRU kept it and lost app1's s03)."""
    cycle = ("s00", "s01", "s02", "s03")
    hints = HintTable()

    def call(app: str, agent: str) -> None:
        at = cycle.index(agent)
        hints.apply_hint(KVFlowHint(workflow_id="w", namespace=app, agent=agent,
                                    steps={a: (i - at) % 4 for i, a in enumerate(cycle)}))

    call("app1", "s00")
    call("app0", "s01")
    app1_s03 = kvflow_key({("app1", "s03")}, hints, last_access=17)
    app0_s00 = kvflow_key({("app0", "s00")}, hints, last_access=19)
    assert app1_s03[:2] == app0_s00[:2] == (TIER_HINTED, -3)
    assert app0_s00 < app1_s03
    # A steps update advances its workflow too: app1 now began its step last.
    hints.apply_steps(StepsUpdate(workflow_id="w", namespace="app1", steps={"s00": 0, "s03": 3}))
    assert kvflow_key({("app1", "s03")}, hints, 17) < kvflow_key({("app0", "s00")}, hints, 19)
    # Within one workflow equal steps stay LRU; a node shared across workflows at equal steps
    # takes the earlier advance (the least evictable reading).
    hints.set_steps("ns", "w1", {"x": 2, "y": 2})
    hints.set_steps("ns", "w2", {"z": 2})
    assert kvflow_key({("ns", "x")}, hints, 1) < kvflow_key({("ns", "y")}, hints, 2)
    assert kvflow_key({("ns", "x"), ("ns", "z")}, hints, 0) == kvflow_key({("ns", "x")}, hints, 0)
    assert hints.advanced(("ns", "nobody")) == 0


def test_zero_steps_across_workflows_tie_to_lru_not_to_the_advance():
    """ReAct agents, each its own one-agent workflow at 0 steps (benchmarks/vllm_react.py on
    vLLM): A's call arrived first, B's second, and B's ended last. Both workflows have reached
    their agent, so the advance says nothing about which is needed first; evicting the one that
    advanced last evicted the conversation about to come back from a fast tool (issue 24, plain
    kvflow below LRU: benchmarks/results/react-tools/vllm/plain-vs-lru.md). LRU decides."""
    hints = HintTable()
    hints.apply_hint(KVFlowHint(workflow_id="wa", namespace="ns", agent="A", steps={"A": 0}))
    hints.apply_hint(KVFlowHint(workflow_id="wb", namespace="ns", agent="B", steps={"B": 0}))
    assert hints.advanced(("ns", "A")) < hints.advanced(("ns", "B"))
    a, b = kvflow_key({("ns", "A")}, hints, last_access=5), kvflow_key({("ns", "B")}, hints, last_access=9)
    assert a[:2] == b[:2] == (TIER_HINTED, 0)
    assert a < b
    # Above 0 steps the advance still decides (the workflow that advanced last reaches its agent last).
    hints.set_steps("ns", "wa", {"A": 2})
    hints.set_steps("ns", "wb", {"B": 2})
    assert kvflow_key({("ns", "B")}, hints, 1) < kvflow_key({("ns", "A")}, hints, 9)


def test_lru_policy_ignores_hints(make_cache):
    cache = make_cache(device_tokens=64, policy="lru")
    build_workflow(cache)
    cache.apply_hint(KVFlowHint(workflow_id="w", namespace="ns", agent="A", steps={"B": 2, "C": 1}))
    put(cache, FIXED["A"] + (100, 200))  # A becomes the most recent path
    order = evict_order(cache)
    assert order[0] == FIXED["B"] + (101, 201) and order[-1] == SYS
    assert order.index(FIXED["A"]) > order.index(FIXED["C"])


def test_no_host_tier_drops_and_full_host_evicts_host_first(make_cache):
    gpu_only = make_cache(device_tokens=8)
    put(gpu_only, [1, 2, 3, 4])
    res = gpu_only.evict_device(4)
    assert (res.freed, res.dropped, res.demoted) == (4, 4, ())
    assert len(gpu_only.tree) == 0 and gpu_only.stats.evicted_device_tokens == 4

    cache = make_cache(device_tokens=8, host_tokens=4)
    put(cache, [1, 2, 3, 4])
    first = cache.evict_device(4)
    assert len(first.demoted) == 1 and first.dropped == 0
    assert cache.match_prefix([1, 2, 3, 4]).host_tokens == 4
    put(cache, [5, 6, 7, 8])
    second = cache.evict_device(4)  # host full: [1..4] is dropped from host to make room
    assert second.demoted[0].host_slots == first.demoted[0].host_slots
    assert cache.match_prefix([1, 2, 3, 4]).cached_tokens == 0
    assert cache.match_prefix([5, 6, 7, 8]).host_tokens == 4
    assert cache.stats.evicted_host_tokens == 4
    cache.check_integrity()


def test_evict_host_drops_only_unlocked_host_leaves(make_cache):
    cache = make_cache(device_tokens=16, host_tokens=16)
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 9, 9])
    assert cache.evict_device(100).freed == 6  # [1,2] + [3,4] + [9,9], all demoted
    locked = cache.match_prefix([1, 2, 3, 4])
    cache.lock(locked.last_node)  # host-only but locked (e.g. its load failed): kept
    res = cache.evict_host(1)
    assert (res.freed, res.dropped) == (2, 2) and cache.match_prefix([1, 2, 9, 9]).cached_tokens == 2
    assert cache.evict_host(100).freed == 0
    cache.unlock(locked.last_node)
    assert cache.evict_host(100).freed == 4
    assert len(cache.tree) == 0
    with pytest.raises(CacheError):
        cache.evict_device(-1)
    cache.check_integrity()


def test_dropping_a_device_node_drops_its_host_only_subtree(make_cache):
    cache = make_cache(device_tokens=16, host_tokens=2)
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 3, 4, 5, 6])
    cache.evict_device(2)  # [5, 6] demoted (host now full)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).host_tokens == 2
    put(cache, [7, 7])
    cache.lock(cache.match_prefix([7, 7]).last_node)
    res = cache.evict_device(4)  # [1..4] has no host room: dropped with its host-only child
    assert res.dropped == 6 and cache.stats.evicted_host_tokens == 2
    cache.check_integrity()


def test_belady_evicts_the_farthest_next_use(make_cache):
    a, b, c = (1, 1, 1), (2, 2, 2), (3, 3, 3)
    future = [a, b, c, b, a, c]
    cache = KVCache(CacheConfig(device_tokens=6, policy="belady"), policy_options={"future": future})
    assert isinstance(cache.policy, BeladyPolicy)
    put(cache, a)
    put(cache, b)
    # Next: c needs room; a is next used at request 4, b at request 3 -> evict a.
    put(cache, c)
    assert cache.match_prefix(a).cached_tokens == 0 and cache.match_prefix(b).cached_tokens == 3


def test_policy_registry():
    assert {"lru", "kvflow", "belady"} <= set(policy_names())
    assert "belady" not in policy_names(online=True) and {"lru", "kvflow"} <= set(policy_names(online=True))
    with pytest.raises(ValueError, match="unknown eviction policy 'mru'"):
        make_policy("mru", HintTable())
    with pytest.raises(ValueError, match="unknown eviction policy"):
        KVCache(CacheConfig(device_tokens=4, policy="nope"))
    with pytest.raises(ValueError, match="'belady' does not take options \\['futur'\\]"):
        KVCache(CacheConfig(device_tokens=4, policy="belady"), policy_options={"futur": [(1,)]})
    with pytest.raises(ValueError, match="'lru' does not take options"):
        make_policy("lru", HintTable(), future=[])


def test_eviction_order_agrees_with_sorting_by_kvflow_key(make_cache):
    """The facade evicts exactly in kvflow_key order among current leaves (what the SGLang
    plugin reproduces with the same key function on its own nodes)."""
    cache = make_cache(device_tokens=64)
    build_workflow(cache)
    cache.apply_hint(KVFlowHint(workflow_id="w", namespace="ns", agent="C", steps={"A": 1, "B": 4}))
    while cache._device_leaves:
        leaves = sorted(cache._device_leaves, key=lambda n: (kvflow_key(n.tags, cache.hints, n.last_access), n.id))
        victim = leaves[0]
        cache.evict_device(1)
        assert victim.device is None and victim.state is not NodeState.DEVICE
    assert math.isinf(cache.hints.steps(("ns", "nobody")))


def test_expired_workflow_falls_back_to_lru_at_the_next_eviction(make_cache, clock):
    cache = make_cache(device_tokens=64)
    build_workflow(cache)
    cache.apply_steps(StepsUpdate(workflow_id="old", namespace="ns", steps={"A": 0, "B": 1}))
    clock.now += 300
    cache.apply_steps(StepsUpdate(workflow_id="new", namespace="ns", steps={"C": 5}))
    clock.now += 301  # "old" is past its 600 s TTL; nobody called expire() explicitly
    order = evict_order(cache)
    # A and B lost their steps: they go (LRU: A older) before C, protected by the live workflow.
    assert order[3:] == [FIXED["A"], FIXED["B"], FIXED["C"], SYS]
    assert cache.hints.workflow_count == 1
