"""RequestIntake: the one hint intake, fixed-boundary rule, agent registry and counters of every host."""

from __future__ import annotations

import pytest

from backends.kvcache import UNHINTED, AgentRequest, CacheConfig, RequestIntake
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from kvcache_helpers import FakeClock

SYSTEM, DESIGN = [1] * 8, [2] * 8


def hint(agent: str, **steps: float) -> KVFlowHint:
    return KVFlowHint(workflow_id="w", namespace="ns", agent=agent, steps=steps or {agent: 0})


def intake(**options) -> RequestIntake:
    return RequestIntake(CacheConfig(device_tokens=64, **options), clock=FakeClock())


def test_a_hinted_request_applies_its_hint_and_gets_its_declared_boundary():
    it = intake()
    decision = it.accept(AgentRequest(SYSTEM + [5, 6], hint("coder", coder=0, qa=1), fixed_prefix_tokens=8))
    assert decision[:2] == (("ns", "coder"), 8)
    assert it.hints.steps(("ns", "qa")) == 1
    assert it.accept(AgentRequest([1, 2], hint("coder"), fixed_prefix_tokens=9)).fixed_tokens == 2  # clamped
    assert it.counters["hinted_requests"] == 2


def test_the_declared_boundary_is_a_floor_what_two_calls_share_extends_it():
    # an Engineer in a fix loop re-sends the same design after its fixed prompt
    it = intake()
    assert it.accept(AgentRequest(SYSTEM + DESIGN + [3] * 4, hint("eng"), 8)).fixed_tokens == 8  # first call
    assert it.accept(AgentRequest(SYSTEM + DESIGN + [4] * 6, hint("eng"), 8)).fixed_tokens == 16  # + the design
    assert it.accept(AgentRequest(SYSTEM + [9] * 12, hint("eng"), 8)).fixed_tokens == 8  # shares less: the floor


def test_without_a_declared_boundary_the_prefix_shared_with_the_previous_request_is_fixed():
    it = intake()
    assert it.accept(AgentRequest(SYSTEM + [5], hint("qa"))).fixed_tokens == 0  # one request tells nothing
    assert it.accept(AgentRequest(SYSTEM + [6, 7], hint("qa"))).fixed_tokens == 8
    assert it.accept(AgentRequest(SYSTEM + [6, 9], hint("other"))).fixed_tokens == 0  # per agent


def test_unhinted_requests_are_counted_and_decided_nothing():
    it = intake()
    assert it.accept(AgentRequest([1, 2, 3])) is UNHINTED
    assert it.counters["unhinted_requests"] == 1 and it.counters["hinted_requests"] == 0
    assert it.hints.workflow_count == 0


def test_a_negative_boundary_is_refused_changing_nothing():
    it = intake()
    with pytest.raises(ValueError, match="fixed_prefix_tokens must be >= 0, got -1"):
        it.accept(AgentRequest([1, 2], hint("a"), -1))
    assert it.hints.workflow_count == 0 and it.counters["hinted_requests"] == 0


def test_the_registry_returns_what_to_untag_and_feeds_the_namespace_cap():
    it = intake(max_tracked_agents=2)
    assert it.remember(("ns", "a"), (1, 2, 3), 3) == []
    assert it.hints.fixed_tokens(("ns", "a")) == 3
    assert it.remember(("ns", "a"), (1, 2), 2) == [(("ns", "a"), (1, 2, 3))]  # a moved boundary
    assert it.remember(("ns", "a"), (1, 2), 2) == []  # the same record again: nothing stale
    it.remember(("ns", "b"), (4,), 1)
    assert it.remember(("ns", "c"), (5,), 1) == [(("ns", "a"), (1, 2))]  # forgotten beyond the bound
    assert it.hints.fixed_tokens(("ns", "a")) == 0 and ("ns", "a") not in it.prefixes
    assert it.remember(("ns", "c"), (), 0) == [(("ns", "c"), (5,))] and ("ns", "c") not in it.prefixes
    assert it.counters["tagged_requests"] == 5  # every remember with tokens


def test_due_lists_recorded_prefixes_most_urgent_first_and_steps_updates_count():
    it = intake(namespace_cap_tokens=100)
    it.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"a": 1, "b": 0, "c": 0}))
    it.remember(("ns", "a"), (1,), 1)
    it.remember(("ns", "b"), (2,), 1)
    assert it.due(1) == [(0.0, ("ns", "b"), (2,)), (1.0, ("ns", "a"), (1,))]  # c has no record
    assert it.snapshot() == {"counters": {"hinted_requests": 0, "unhinted_requests": 0, "tagged_requests": 2,
                                          "steps_updates": 1, "continuations_kept": 0, "continuations_reused": 0,
                                          "continuations_expired": 0},
                             "workflows": 1, "agents_with_prefix": 2, "continuations": 0}


def test_a_host_that_learns_its_pool_later_sizes_the_cap_and_the_token_bounds():
    it = RequestIntake(CacheConfig(device_tokens=1))
    it.size_for(CacheConfig(device_tokens=1 << 20))
    assert it.hints.cap_tokens == 1 << 19
    assert it.segmenter.max_tokens == it.prefixes.max_tokens == 4 << 20


def test_the_cache_tags_what_its_intake_decided(make_cache):
    from kvcache_helpers import put

    cache = make_cache(device_tokens=64)
    for tail in ([3], [4]):
        decision = cache.accept(AgentRequest(SYSTEM + DESIGN + tail, hint("eng"), 8))
        put(cache, SYSTEM + DESIGN + tail, agent=decision.agent, fixed=decision.fixed_tokens)
        if tail == [3]:
            assert cache.fixed_prefix(("ns", "eng")) == tuple(SYSTEM)
            assert cache.match_prefix(SYSTEM + DESIGN).last_node.tags is None
    assert cache.fixed_prefix(("ns", "eng")) == tuple(SYSTEM + DESIGN)  # the second call shared the design
    assert cache.match_prefix(SYSTEM + DESIGN).last_node.tags == {("ns", "eng")}
    assert cache.match_prefix(SYSTEM + DESIGN + [4]).last_node.tags is None
    decision = cache.accept(AgentRequest(SYSTEM + [9], hint("eng"), 8))
    put(cache, SYSTEM + [9], agent=decision.agent, fixed=decision.fixed_tokens)
    assert ("ns", "eng") not in (cache.match_prefix(SYSTEM + DESIGN).last_node.tags or ())  # the tail untagged
    assert cache.match_prefix(SYSTEM).last_node.tags == {("ns", "eng")}
    assert cache.intake.counters["tagged_requests"] == 3
