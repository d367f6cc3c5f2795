"""The kvflow strategy inside SGLang orders evictions exactly as backends/kvcache does.

Both caches see the same operations (the same hinted requests, an out-of-band steps update, then
one-token evictions until the tier is empty); after every eviction we compare, per request, how many
leading tokens each cache still holds. SGLang's side is the real UnifiedRadixCache (Python tree
core, HiCache write-through on CPU) with the plugin loaded through its entry point.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang

SYSTEM = [1, 2, 3, 4]
OWN = {"A": [10, 11, 12, 13], "B": [20, 21, 22, 23], "C": [30, 31, 32, 33], "D": [40, 41, 42, 43]}
STEPS = {"A": 2, "B": 0, "C": 5, "D": None}   # D: not expected to run again (inf)
FIXED = len(SYSTEM) + 4


def _requests() -> list[tuple[str | None, list[int]]]:
    reqs: list[tuple[str | None, list[int]]] = []
    for round_ in range(2):
        for agent, own in OWN.items():
            reqs.append((agent, SYSTEM + own + [100 + 10 * round_ + len(reqs), 200 + len(reqs)]))
    reqs.append((None, [90, 91, 92, 93, 94, 95]))  # a plain request without hints: all dynamic
    return reqs


def _hint(agent: str) -> dict:
    return {"kvflow": {"workflow_id": "wf", "namespace": "ns", "agent": agent, "steps": STEPS},
            "kvflow_fixed_tokens": FIXED}


def _build_sglang(make_rig):
    from backends.sglang_kvflow.tags import on_request_queued

    rig = make_rig(size=64, policy="kvflow", hicache=True)
    for agent, tokens in _requests():
        req = rig.make_req(tokens, _hint(agent) if agent else None)
        on_request_queued(None, req)  # the BEFORE hook of Scheduler._add_request_to_queue
        rig.run_req(req)
    return rig


def _build_brain():
    from backends.kvcache import CacheConfig, KVCache
    from kvflow_orch.protocol import KVFlowHint

    brain = KVCache(CacheConfig(device_tokens=64, host_tokens=64, policy="kvflow", write_through=True))
    for agent, tokens in _requests():
        ref = None
        if agent:
            brain.apply_hint(KVFlowHint(workflow_id="wf", namespace="ns", agent=agent, steps=STEPS))
            ref = ("ns", agent)
        adm = brain.admit(tokens)
        alloc = brain.alloc_device(len(tokens) - adm.match.device_tokens)
        res = brain.insert(tokens, adm.match.device_slots + alloc.slots, agent=ref, fixed_prefix_tokens=FIXED)
        if res.offload is not None:
            brain.complete_offload(res.offload)
        brain.unlock(adm.match.last_node)
    return brain


def _sglang_held(rig, host: bool) -> list[int]:
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    out = []
    for _, tokens in _requests():
        m = rig.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        out.append(m.device_prefix_len + (m.host_hit_length if host else 0))
    return out


def _brain_held(brain, host: bool) -> list[int]:
    out = []
    for _, tokens in _requests():
        m = brain.match_prefix(tokens)
        out.append(m.device_tokens + (m.host_tokens if host else 0))
    return out


def _update(steps: dict) -> None:
    """The same out-of-band update through the plugin's scheduler handler."""
    from backends.sglang_kvflow.hints_bridge import KVFlowStepsReq, handle_steps

    handle_steps(None, KVFlowStepsReq(workflow_id="wf", namespace="ns", steps=steps))


def _evict_in_lockstep(rig, brain, *, host: bool, before_step=None) -> list[list[int]]:
    """Evict one token at a time from both caches until the tier is empty; compare after each."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tier = "host" if host else "device"
    trajectory = []
    for step in range(40):
        if before_step is not None:
            before_step(step)
        if host:
            rig.cache.evict_host(1)
            brain.evict_host(1)
        else:
            rig.cache.evict(EvictParams(num_tokens=1))
            brain.evict_device(1)
        rig.cache.sanity_check()
        ours, theirs = _sglang_held(rig, host=host), _brain_held(brain, host=host)
        assert ours == theirs, f"{tier} eviction {step} diverged: sglang {ours} vs backends.kvcache {theirs}"
        trajectory.append(ours)
        if not any(ours):
            return trajectory
    raise AssertionError(f"the {tier} tier did not empty in 40 evictions")


def test_device_then_host_eviction_order_matches_backends_kvcache(make_rig):
    from kvflow_orch.protocol import StepsUpdate

    rig = _build_sglang(make_rig)
    brain = _build_brain()
    assert _sglang_held(rig, host=False) == _brain_held(brain, host=False)

    def change_steps(step: int) -> None:
        if step == 6:  # steps change mid-way: keys must come from the live table
            new = {"A": 1, "B": 4, "C": 0, "D": None}
            _update(new)
            brain.apply_steps(StepsUpdate(workflow_id="wf", namespace="ns", steps=new))

    device = _evict_in_lockstep(rig, brain, host=False, before_step=change_steps)
    # Not LRU's order: every dynamic suffix (and the unhinted request) goes before any fixed prefix.
    first_fixed_loss = next(i for i, held in enumerate(device) if min(held[:8]) < FIXED)
    assert first_fixed_loss >= 8 and device[first_fixed_loss - 1][:8] == [FIXED] * 8
    # After the update C (steps 0) outlives A and B; the shared system prompt (min = 0) goes last.
    assert device[-3] == [4, 4, FIXED, 4, 4, 4, FIXED, 4, 0]
    assert device[-2] == [4] * 8 + [0]
    host = _evict_in_lockstep(rig, brain, host=True)
    assert len(host) > 4


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
