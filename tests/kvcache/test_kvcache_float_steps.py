"""Fractional (expected) steps in the brain: prefetch picks by them (eviction orders by them: the
eviction spec's ``fractional_steps_order_as_numbers``, tests/conformance)."""

from __future__ import annotations

from kvflow_orch.protocol import StepsUpdate

from test_kvcache_prefetch import agent_tokens, setup


def test_prefetch_takes_fractional_steps_within_the_lookahead_most_likely_first(make_cache):
    cache = make_cache(device_tokens=16, host_tokens=64, namespace_cap_tokens=64, prefetch_lookahead=4,
                       max_inflight_loads=4)
    setup(cache, "abc")
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"a": 3.5, "b": 1.25, "c": 4.5}))
    plan = cache.plan_prefetch()
    # c is beyond the lookahead; room for two prefixes: b (1.25) first, then a (3.5)
    loaded = [cache.match_prefix(agent_tokens(x)).device_tokens for x in "abc"]
    assert len(plan.tasks) == 2 and loaded == [8, 8, 0]
    for task in plan.tasks:
        cache.complete_load(task)
    # a more likely agent takes the room of the least likely loaded one, never the reverse
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"a": 3.5, "b": 1.25, "c": 0.5}))
    plan = cache.plan_prefetch()
    for task in plan.tasks:
        cache.complete_load(task)
    assert [cache.match_prefix(agent_tokens(x)).device_tokens for x in "abc"] == [0, 8, 8]
    cache.check_integrity()
