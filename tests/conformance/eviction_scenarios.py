"""The eviction spec's one table: every scenario each host plays (vocabulary in :mod:`eviction_spec`).

Agents A..D share the system block ``sys`` and own one block each, so an agent's fixed prefix is 2
blocks; each call adds one fresh block (its dynamic suffix) unless it says otherwise. Pools are
sized so every call fits and the first :class:`Pressure` meets a full pool: it then evicts exactly
its own size. Each hinted scenario is built so LRU leaves different survivors (the test module
checks that too); each ``rule`` is what a host breaks when it fails.
"""

from __future__ import annotations

from typing import Any

from eviction_spec import HOST_TIER, Call, EvictHost, Pressure, Scenario, StepMap, Steps

__all__ = ["SCENARIOS", "AGENTS", "calls"]

AGENTS = {agent: ("sys", agent) for agent in "ABCD"}


def calls(order: str, steps: StepMap | None, **options: Any) -> tuple[Call, ...]:
    """One call per label of ``order`` (one letter each), in that order, all with ``steps``."""
    return tuple(Call(label, steps, **options) for label in order)


def _scenarios() -> tuple[Scenario, ...]:
    s123 = {"A": 1, "B": 2, "C": 3}
    return (
        Scenario(
            "untagged_suffixes_and_plain_requests_go_first",
            "untagged entries (dynamic suffixes, unhinted requests) are evicted before any fixed "
            "prefix, however recently used",
            pool_blocks=9, prompts={**AGENTS, "P": ("P1", "P2")},
            ops=(*calls("ABC", s123), Call("P", suffix=0), Pressure(5)),
            survivors=frozenset("ABC")),
        Scenario(
            "farther_steps_go_first",
            "among fixed prefixes, the agent furthest from running (largest steps) goes first",
            pool_blocks=7, prompts=AGENTS,
            ops=(*calls("CAB", {"A": 1, "B": 3, "C": 2}), Pressure(5)),
            survivors=frozenset("A")),
        Scenario(
            "steps_update_reranks_cached_prefixes",
            "a steps update re-ranks prefixes already cached (keys come from the live table)",
            pool_blocks=7, prompts=AGENTS,
            ops=(*calls("ABC", s123), Steps({"A": 3, "B": 2, "C": 1}), Pressure(4)),
            survivors=frozenset("BC")),
        Scenario(
            "done_forgets_the_workflow",
            "done drops a workflow's steps: its agents fall below every agent with finite steps",
            pool_blocks=7, prompts=AGENTS,
            ops=(Call("C", {"C": 4}, workflow="w2"), *calls("AB", {"A": 1, "B": 1}, workflow="w1"),
                 Steps(workflow="w1", done=True), Pressure(5)),
            survivors=frozenset("C")),
        Scenario(
            "not_expected_again_goes_after_untagged_before_finite",
            "steps null (not expected again): after untagged entries, before any finite steps",
            pool_blocks=6, prompts={**AGENTS, "P": ("P1",)},
            ops=(*calls("AD", {"A": 5, "D": None}), Call("P", suffix=0), Pressure(4)),
            survivors=frozenset("A")),
        Scenario(
            "equal_steps_break_ties_least_recently_used_first",
            "equal steps: the least recently used prefix goes first",
            pool_blocks=8, prompts={**AGENTS, "P": ("P1",)},
            ops=(*calls("BCA", {"A": 2, "B": 2, "C": 2}), Call("P", suffix=0), Pressure(6)),
            survivors=frozenset("A")),
        Scenario(
            "equal_steps_across_workflows_evict_the_one_that_advanced_last",
            "equal steps in two workflows: the agent of the workflow whose latest hint or update "
            "came last goes first (it reaches that step last); LRU within a workflow",
            pool_blocks=7, prompts=AGENTS,
            ops=(Call("A", {"A": 2}, workflow="w1"), Call("B", {"B": 2}, workflow="w2"),
                 Call("C", {"A": 2, "C": 2}, workflow="w1"), Pressure(5)),
            survivors=frozenset("B")),
        Scenario(
            "fractional_steps_order_as_numbers",
            "fractional (expected) steps order as numbers: 2.75 goes before 2.5",
            pool_blocks=7, prompts=AGENTS,
            ops=(*calls("BAC", {"A": 2.75, "B": 2.5, "C": 0.5}), Pressure(4)),
            survivors=frozenset("BC")),
        Scenario(
            "shared_prefix_takes_the_min_of_its_agents",
            "a prefix shared by agents is kept by the most urgent of them (min steps), also once "
            "their own blocks are gone",
            pool_blocks=8, prompts={**AGENTS, "S": ("sys",), "X": ("X1", "X2")},
            ops=(*calls("XAB", {"A": 5, "B": 5, "X": 3}), Pressure(4), Steps({"A": 1, "B": 5, "X": 3}), Pressure(7)),
            survivors=frozenset("S")),
        Scenario(
            "namespace_cap_unprotects_the_least_urgent",
            "a namespace protects fixed prefixes in ascending steps up to its cap; the rest rank "
            "below every protected prefix of another namespace",
            pool_blocks=9, prompts=AGENTS, namespace_cap_blocks=4,
            ops=(*calls("CAB", s123), Call("D", {"D": 4}, workflow="w2", namespace="ns2"), Pressure(5)),
            survivors=frozenset("ABD")),
        Scenario(
            "default_namespace_cap_is_half_the_device_pool",
            "without a configured cap a namespace protects at most half the device pool",
            pool_blocks=9, prompts=AGENTS, namespace_cap_blocks=None,
            ops=(*calls("CAB", s123), Call("D", {"D": 4}, workflow="w2", namespace="ns2"), Pressure(5)),
            survivors=frozenset("ABD")),
        Scenario(
            "inferred_fixed_prefix_is_the_common_prefix",
            "without a declared boundary an agent's fixed prefix is what its requests share",
            pool_blocks=7, prompts=AGENTS,
            ops=(*calls("AABB", {"A": 1, "B": 2}, declared=False), Pressure(5)),
            survivors=frozenset("A")),
        Scenario(
            "what_an_agent_repeats_after_its_declared_prefix_is_fixed_too",
            "the fixed boundary is the longer of the declared prefix and what the agent's request "
            "shares with its previous one, so a repeated block after the declared prefix is protected",
            pool_blocks=7, prompts={**AGENTS, "A+doc": ("sys", "A", "doc")},
            ops=(*calls("AA", {"A": 1, "B": 3}, dynamic=("doc",)), Call("B", {"A": 1, "B": 3}), Pressure(4)),
            survivors=frozenset({"A", "A+doc"})),
        Scenario(
            "without_hints_the_order_is_lru",
            "plain requests only: least recently used first",
            pool_blocks=7, prompts={"P": ("P1",), "Q": ("Q1",), "R": ("R1",)},
            ops=(*calls("QPRQ", None), Pressure(3)),
            survivors=frozenset("QR")),
        Scenario(
            "host_tier_drops_in_the_same_order",
            "host eviction follows the device order: untagged first, then largest steps",
            pool_blocks=7, prompts=AGENTS, tier="any", requires=frozenset({HOST_TIER}),
            ops=(*calls("ABC", s123), Pressure(7), EvictHost(4)),
            survivors=frozenset("AB")),
    )


SCENARIOS = _scenarios()
