"""Prefetch planner: candidates, budget rules, in-flight limit, readiness, complete/fail_load."""

from __future__ import annotations

import pytest

from backends.kvcache import NodeState, UnknownTaskError
from kvflow_orch.protocol import StepsUpdate

from kvcache_helpers import put


def agent_tokens(agent: str, n: int = 8) -> list[int]:
    return [ord(agent)] * n


def setup(cache, agents: str) -> None:
    """Each agent's 8-token fixed prefix cached, then everything demoted to host."""
    for a in agents:
        put(cache, agent_tokens(a), agent=("ns", a), fixed=8)
    cache.evict_device(10**6)
    cache.check_integrity()


def steps(cache, **values) -> None:
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps=values))


def test_due_agents_are_loaded_and_not_ready_until_complete(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=64, namespace_cap_tokens=64)
    setup(cache, "abc")
    steps(cache, a=0, b=1, c=2)  # lookahead 1: a and b (every branch candidate), not c
    plan = cache.plan_prefetch()
    assert [t.tokens for t in plan.tasks] == [8, 8] and all(t.prefetch for t in plan.tasks)
    m = cache.match_prefix(agent_tokens("b"))
    assert m.device_tokens == 8 and not cache.is_ready(m)
    assert m.last_node.state is NodeState.LOADING
    assert cache.plan_prefetch().tasks == ()  # already loading: no duplicate task
    for task in plan.tasks:
        cache.complete_load(task)
    assert cache.is_ready(cache.match_prefix(agent_tokens("b")))
    assert cache.match_prefix(agent_tokens("c")).host_tokens == 8
    before = cache.stats.as_dict()
    adm = cache.admit(agent_tokens("b") + [1])
    assert cache.stats.prefetch_hit_tokens == 8 and cache.stats.prefetched_tokens == 16
    assert cache.stats.host_hit_tokens == 0
    assert cache.stats.recomputed_tokens - before["recomputed_tokens"] == 1
    cache.unlock(adm.match.last_node)
    cache.check_integrity()


def test_budget_never_evicts_a_more_urgent_prefix(make_cache):
    cache = make_cache(device_tokens=16, host_tokens=64, namespace_cap_tokens=64)
    setup(cache, "b")
    put(cache, agent_tokens("a"), agent=("ns", "a"), fixed=8)
    put(cache, agent_tokens("z"), agent=("ns", "z"), fixed=8)  # device now full: a + z
    steps(cache, a=0, b=1, z=1)
    assert cache.plan_prefetch().tasks == ()  # a (0) is more urgent, z (1) equally urgent
    steps(cache, a=0, b=1, z=5)
    plan = cache.plan_prefetch()
    assert len(plan.tasks) == 1 and plan.evicted.freed == 8
    assert cache.match_prefix(agent_tokens("z")).device_tokens == 0
    assert cache.match_prefix(agent_tokens("a")).device_tokens == 8
    assert plan.evicted.demoted[0].device_slots == plan.tasks[0].device_slots  # z's rows reused
    cache.check_integrity()


def test_untagged_suffixes_are_fair_game_for_the_budget(make_cache):
    cache = make_cache(device_tokens=8, host_tokens=64, namespace_cap_tokens=8)
    setup(cache, "b")
    put(cache, [7] * 8)  # dynamic, untagged
    steps(cache, b=1)
    plan = cache.plan_prefetch()
    assert len(plan.tasks) == 1 and cache.match_prefix([7] * 8).host_tokens == 8


def test_in_flight_limit(make_cache):
    cache = make_cache(device_tokens=64, host_tokens=64, max_inflight_loads=2, namespace_cap_tokens=64)
    setup(cache, "abcd")
    steps(cache, a=0, b=1, c=1, d=1)
    first = cache.plan_prefetch()
    assert len(first.tasks) == 2
    assert cache.plan_prefetch().tasks == ()
    cache.complete_load(first.tasks[0])
    assert len(cache.plan_prefetch().tasks) == 1


def test_fail_load_restores_host_only_and_double_completion_is_an_error(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=64)
    setup(cache, "a")
    steps(cache, a=1)
    (task,) = cache.plan_prefetch().tasks
    free_before = cache.device.free_count
    cache.fail_load(task)
    node = cache.match_prefix(agent_tokens("a")).last_node
    assert node.state is NodeState.HOST and cache.device.free_count == free_before + 8
    with pytest.raises(UnknownTaskError):
        cache.complete_load(task)
    with pytest.raises(UnknownTaskError):
        cache.fail_load(task)
    assert cache.stats.prefetched_tokens == 0
    cache.check_integrity()
    (again,) = cache.plan_prefetch().tasks  # the next plan retries it
    assert again.task_id != task.task_id


def test_unused_prefetch_is_counted_when_evicted(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=64)
    setup(cache, "a")
    steps(cache, a=1)
    (task,) = cache.plan_prefetch().tasks
    cache.complete_load(task)
    steps(cache, a=None)
    cache.evict_device(8)
    assert cache.stats.prefetch_unused_tokens == 8


def test_no_prefetch_without_host_tier_or_when_disabled(make_cache):
    for cache in (make_cache(device_tokens=32), make_cache(device_tokens=32, host_tokens=32, prefetch=False)):
        put(cache, agent_tokens("a"), agent=("ns", "a"), fixed=8)
        cache.evict_device(8)
        steps(cache, a=0)
        assert cache.plan_prefetch().tasks == ()


def test_demand_load_at_admission_counts_host_hits(make_cache):
    cache = make_cache(device_tokens=32, host_tokens=64)
    setup(cache, "a")
    before = cache.stats.recomputed_tokens
    adm = cache.admit(agent_tokens("a") + [1, 2])
    assert adm.load is not None and not adm.load.prefetch and adm.match.host_tokens == 8
    assert cache.stats.host_hit_tokens == 8 and cache.stats.recomputed_tokens - before == 2
    cache.fail_load(adm.load)  # nodes back to host-only; the request recomputes or retries
    assert adm.match.last_node.state is NodeState.HOST
    cache.unlock(adm.match.last_node)
    cache.check_integrity()
