"""Hint table (min over workflows, TTL, done, namespace cap, bad input) and segmentation."""

from __future__ import annotations

import math

import pytest

from backends.kvcache import TIER_UNHINTED, HintError, HintTable, Segmenter, kvflow_key
from kvflow_orch.protocol import MAX_AGENTS, KVFlowHint, StepsUpdate

from kvcache_helpers import FakeClock, put


def test_concurrent_workflows_combine_by_min_and_done_forgets():
    hints = HintTable()
    hints.set_steps("ns", "w1", {"coder": 3, "tester": 1})
    hints.set_steps("ns", "w2", {"coder": 1})
    assert hints.steps(("ns", "coder")) == 1 and hints.steps(("ns", "tester")) == 1
    assert math.isinf(hints.steps(("other", "coder")))  # namespaces are separate
    hints.apply_steps(StepsUpdate(workflow_id="w2", namespace="ns", done=True))
    assert hints.steps(("ns", "coder")) == 3
    hints.set_steps("ns", "w1", {"tester": 2})  # a new map replaces the old one
    assert math.isinf(hints.steps(("ns", "coder")))
    assert not hints.forget("ns", "never-seen")


def test_hint_sets_the_calling_agent_to_zero_unless_given():
    hints = HintTable()
    hints.apply_hint(KVFlowHint(workflow_id="w", agent="planner", steps={"coder": 1}))
    assert hints.steps(("default", "planner")) == 0
    hints.apply_hint(KVFlowHint(workflow_id="w", agent="planner", steps={"planner": 4}))
    assert hints.steps(("default", "planner")) == 4


def test_ttl_expiry_falls_back_to_lru():
    clock = FakeClock()
    hints = HintTable(ttl_s=600, clock=clock)
    hints.set_steps("ns", "old", {"a": 1})
    clock.now += 300
    hints.set_steps("ns", "new", {"b": 2})
    clock.now += 301
    assert hints.expire() == 1
    assert math.isinf(hints.steps(("ns", "a"))) and hints.steps(("ns", "b")) == 2
    clock.now += 300
    assert hints.expire() == 1 and hints.workflow_count == 0


def test_namespace_cap_unprotects_the_least_urgent_agents():
    hints = HintTable(cap_tokens=100)
    for agent, tokens in {"a": 60, "b": 30, "c": 30}.items():
        hints.note_fixed_tokens(("greedy", agent), tokens)
        hints.note_fixed_tokens(("polite", agent), tokens)
    hints.set_steps("greedy", "w", {"a": 0, "b": 1, "c": 2})
    hints.set_steps("polite", "w", {"a": 0, "b": 1})
    assert [hints.steps(("greedy", x)) for x in "abc"] == [0, 1, math.inf]
    assert hints.protected_tokens("greedy") == 90 <= 100
    assert hints.raw_steps(("greedy", "c")) == 2
    assert [hints.steps(("polite", x)) for x in "ab"] == [0, 1]  # one namespace cannot starve another
    # Unprotected agents rank below every protected one, yet keep their steps order among
    # themselves (after agents that will not run again).
    keys = {x: kvflow_key({("greedy", x)}, hints, 0) for x in "bc"}
    hints.set_steps("greedy", "w2", {"gone": None})
    gone = kvflow_key({("greedy", "gone")}, hints, 0)
    assert gone < keys["c"] < keys["b"] and keys["c"][0] == TIER_UNHINTED


def test_cache_caps_protection_at_half_the_device_pool_by_default(make_cache):
    cache = make_cache(device_tokens=40)
    for agent in "abc":
        put(cache, [ord(agent)] * 8 + [1], agent=("ns", agent), fixed=8)
    cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps={"a": 0, "b": 1, "c": 2}))
    assert cache.hints.protected_tokens("ns") == 16  # 3 x 8 > 20: c loses protection
    assert math.isinf(cache.hints.steps(("ns", "c")))


@pytest.mark.parametrize("steps, match", [
    ({"a": -1}, "must be >= 0"),
    ({"a": float("nan")}, "expected a number"),
    ({"a": "3"}, "expected a number"),
    ({"": 1}, "non-empty"),
    ({f"a{i}": 1 for i in range(MAX_AGENTS + 1)}, "limit"),
])
def test_bad_steps_are_rejected_and_change_nothing(steps, match):
    hints = HintTable()
    hints.set_steps("ns", "w", {"a": 2})
    version = hints.version
    with pytest.raises(HintError, match=match):
        hints.set_steps("ns", "w", steps)
    assert hints.steps(("ns", "a")) == 2 and hints.version == version


def test_hints_for_unknown_agents_are_kept_harmlessly(make_cache):
    cache = make_cache(device_tokens=16, host_tokens=16)
    cache.apply_hint(KVFlowHint(workflow_id="w", agent="ghost", steps={"nobody": 0}))
    assert cache.hints.steps(("default", "nobody")) == 0 == cache.hints.steps(("default", "ghost"))
    assert cache.plan_prefetch().tasks == ()  # kept, yet nothing cached to load for them
    cache.check_integrity()


def test_workflow_table_is_bounded():
    hints = HintTable(max_workflows=3)
    for i in range(10):
        hints.set_steps("ns", f"w{i}", {f"a{i}": 1})
    assert hints.workflow_count == 3 and math.isinf(hints.steps(("ns", "a0")))


def test_segmentation_explicit_boundary_wins_and_heuristic_needs_two_requests():
    seg = Segmenter(history=2)
    ref = ("ns", "coder")
    assert seg.observe(ref, [1, 2, 3, 4, 5]) == 0  # first request: all dynamic
    assert seg.observe(ref, [1, 2, 3, 9, 9]) == 3
    assert seg.observe(ref, [1, 2, 3, 9, 7]) == 4  # longest common prefix with the previous one
    assert seg.observe(ref, [1, 2, 3, 8], explicit=2) == 2
    assert seg.observe(ref, [1, 2], explicit=10) == 2  # clamped
    assert seg.observe(("ns", "other"), [1, 2, 3]) == 0  # per agent
    with pytest.raises(ValueError):
        seg.observe(ref, [1], explicit=-1)


def test_segmentation_tags_the_inferred_fixed_prefix(make_cache):
    cache = make_cache(device_tokens=64)
    ref = ("ns", "coder")
    put(cache, [1, 2, 3, 4, 50, 51], agent=ref)
    assert cache.fixed_prefix(ref) is None
    put(cache, [1, 2, 3, 4, 60, 61], agent=ref)
    assert cache.fixed_prefix(ref) == (1, 2, 3, 4)
    assert cache.match_prefix([1, 2, 3, 4]).last_node.tags == {ref}
    assert cache.match_prefix([1, 2, 3, 4, 60, 61]).last_node.tags is None
    put(cache, [1, 2, 70], agent=ref, fixed=3)  # explicit boundary moves the tag
    assert cache.fixed_prefix(ref) == (1, 2, 70)
    assert ref not in (cache.match_prefix([1, 2, 3, 4]).last_node.tags or set())
    assert cache.hints.fixed_tokens(ref) == 3


def test_segmentation_and_fixed_prefix_memory_is_bounded_in_tokens(make_cache):
    seg = Segmenter(history=2, max_tokens=100)
    for i in range(20):
        seg.observe(("ns", f"a{i}"), [i] * 30)
        assert seg.token_count <= 100
    assert seg.observe(("ns", "a19"), [19] * 30) == 30  # the most recent agent is still known
    assert seg.observe(("ns", "a0"), [0] * 30) == 0     # the oldest was forgotten
    cache = make_cache(device_tokens=64, max_tracked_tokens=20)
    for agent in "abc":
        put(cache, [ord(agent)] * 8 + [1], agent=("ns", agent), fixed=8)
    assert cache.fixed_prefix(("ns", "a")) is None and cache.fixed_prefix(("ns", "c")) == (ord("c"),) * 8
    assert cache.match_prefix([ord("a")] * 8).last_node.tags == set()  # its tags went with it


def test_due_lists_only_agents_with_a_known_fixed_prefix_most_urgent_first():
    hints = HintTable(cap_tokens=50)
    hints.set_steps("ns", "w", {"a": 1, "b": 0, "c": 1, "nofixed": 0, "far": 3})
    for agent, tokens in {"a": 20, "b": 20, "c": 20, "far": 5}.items():
        hints.note_fixed_tokens(("ns", agent), tokens)
    # b (0) and a (1) fit in the cap (40 <= 50); c (1) would make 60: unprotected, not due.
    assert hints.due(1) == [(0.0, ("ns", "b")), (1.0, ("ns", "a"))]
    assert hints.steps(("ns", "nofixed")) == 0  # no fixed prefix: costs no cap, keeps its steps
    hints.note_fixed_tokens(("ns", "b"), 0)  # b's prefix is gone: c fits now
    assert [ref for _, ref in hints.due(1)] == [("ns", "a"), ("ns", "c")]


def test_a_prefix_longer_than_the_token_bound_stays_tracked_and_untags_when_it_moves(make_cache):
    cache = make_cache(device_tokens=64, max_tracked_tokens=5)
    ref = ("ns", "big")
    put(cache, [7] * 8 + [1], agent=ref, fixed=8)
    assert cache.fixed_prefix(ref) == (7,) * 8  # over the bound, but the newest entry is kept
    put(cache, [7] * 3 + [2], agent=ref, fixed=3)  # boundary moves: the old tail is untagged
    assert ref not in (cache.match_prefix([7] * 8).last_node.tags or set())
    assert cache.match_prefix([7] * 3).last_node.tags == {ref}
