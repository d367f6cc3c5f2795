"""Agent tags on SGLang's tree nodes, and the strategy's key: the mechanics under the plugin's
eviction order (the order itself is the eviction spec's, tests/conformance/test_eviction_order.py,
which SGLang's real UnifiedRadixCache runs with the same scenarios as the brain and vLLM)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang

SYSTEM = [1, 2, 3, 4]
OWN = {"A": [10, 11, 12, 13], "B": [20, 21, 22, 23], "C": [30, 31, 32, 33], "D": [40, 41, 42, 43]}
STEPS = {"A": 2, "B": 0, "C": 5, "D": None}   # D: not expected to run again (inf)
FIXED = len(SYSTEM) + 4


def _hint(agent: str) -> dict:
    return {"kvflow": {"workflow_id": "wf", "namespace": "ns", "agent": agent, "steps": STEPS},
            "kvflow_fixed_tokens": FIXED}


def test_tags_survive_splits_and_mark_only_the_fixed_prefix(make_rig, state):
    from backends.sglang_kvflow.tags import node_tags, on_request_queued

    rig = make_rig(size=64, policy="kvflow", hicache=False)
    # A first: one node [system + A] gets A's tag. B then shares the system prompt, which splits
    # A's tagged node at 4 tokens: the new upper node must carry A's tag too (and then B's).
    for agent in ("A", "B"):
        req = rig.make_req(SYSTEM + OWN[agent] + [7, 8], _hint(agent))
        on_request_queued(None, req)
        rig.run_req(req)
    core = rig.cache.tree_core
    shared = core.root_node.children[next(iter(core.root_node.children))]
    assert list(shared.key.token_ids) == SYSTEM
    assert node_tags(shared) == {("ns", "A"), ("ns", "B")}
    for child in shared.children.values():
        agent = "A" if child.key.token_ids[0] == 10 else "B"
        assert list(child.key.token_ids) == OWN[agent]
        assert node_tags(child) == {("ns", agent)}
        (suffix,) = child.children.values()
        assert node_tags(suffix) is None  # the dynamic part stays untagged (evicted first)
    assert state.intake.prefixes.get(("ns", "B")).token_ids == tuple(SYSTEM + OWN["B"])
    assert state.hints.fixed_tokens(("ns", "A")) == FIXED


def test_a_request_checkpointed_twice_is_tagged_and_counted_once(make_rig, state):
    from backends.sglang_kvflow.tags import node_tags, on_request_queued

    rig = make_rig(size=64, policy="kvflow", hicache=False)
    req = rig.make_req(SYSTEM + OWN["A"] + [7, 8], _hint("A"))
    on_request_queued(None, req)
    rig.run_req(req, checkpoints=2)  # after its prefill, and again when it ends
    assert state.counters["tagged_requests"] == 1
    core = rig.cache.tree_core
    (node,) = core.root_node.children.values()
    assert list(node.key.token_ids) == SYSTEM + OWN["A"] and node_tags(node) == {("ns", "A")}


def test_a_retracted_request_tags_its_prefix_again(make_rig, state):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from backends.sglang_kvflow.tags import node_tags, on_request_queued

    rig = make_rig(size=64, policy="kvflow", hicache=False)
    req = rig.make_req(SYSTEM + OWN["A"] + [7, 8], _hint("A"))
    on_request_queued(None, req)
    rig.run_req(req)
    rig.cache.evict(EvictParams(num_tokens=64))  # no host tier: the tagged nodes are gone
    assert not rig.cache.tree_core.root_node.children
    on_request_queued(None, req, is_retracted=True)
    rig.run_req(req)  # recomputed into new nodes
    (node,) = rig.cache.tree_core.root_node.children.values()
    assert node_tags(node) == {("ns", "A")} and state.counters["tagged_requests"] == 1


def test_strategy_key_is_backends_kvcache_key(make_rig, state):
    """Node for node, the SGLang strategy's key equals backends.kvcache's KVFlowPolicy key."""
    from backends.kvcache.policy import KVFlowPolicy
    from backends.kvcache.radix import Node
    from backends.sglang_kvflow.strategy import KVFlowStrategy
    from backends.sglang_kvflow.tags import TAGS_ATTR

    rig = make_rig(size=32, policy="kvflow", hicache=False)
    strategy = rig.cache.tree_core.eviction_strategy
    assert isinstance(strategy, KVFlowStrategy)
    state.hints.set_steps("ns", "wf", {"A": 3, "B": 1, "C": None})
    policy = KVFlowPolicy(state.hints)
    sglang_node = rig.cache.tree_core.root_node  # any node object with a last access time
    brain_node = Node(1, (1, 2), None)
    brain_node.last_access = sglang_node.last_access_time
    for tags in (None, {("ns", "A")}, {("ns", "A"), ("ns", "B")}, {("ns", "C")}, {("ns", "Z")}):
        setattr(sglang_node, TAGS_ATTR, tags)
        brain_node.tags = set(tags) if tags else None
        assert strategy.get_priority(sglang_node) == policy.key(brain_node)
