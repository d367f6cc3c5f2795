"""The host tier's kvflow order (CUDA only at run time): what the CPU build can check is that vLLM's
own factory loads the policy by the names the launcher passes, and that its evictions follow the
brain's order over the scheduler's tags, LRU within a tie and without a kvflow scheduler."""

from __future__ import annotations


import pytest

from vllm_server import HAVE_VLLM, SKIP_REASON

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)]


@pytest.fixture
def policy():
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from backends.vllm_kvflow.launcher import OFFLOAD_MODULE, OFFLOAD_POLICY
    from backends.vllm_kvflow.state import set_current_state

    cls = CachePolicyFactory.get_cache_policy_cls(OFFLOAD_POLICY, OFFLOAD_MODULE)
    yield cls(cache_capacity=8)
    set_current_state(None)


def _fill(policy, names):
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    keys = {}
    for i, name in enumerate(names):
        chunk = ChunkStatus(i)
        chunk.ref_cnt = 0
        keys[name] = make_offload_key(name.encode(), 0)
        policy.insert(keys[name], chunk)
    return keys


def _names(evicted, keys):
    back = {v: k for k, v in keys.items()}
    return [back[key] for key, _ in evicted]


def test_host_tier_evicts_untagged_then_by_descending_steps(policy) -> None:
    from backends.kvcache.config import CacheConfig
    from backends.vllm_kvflow.state import KVFlowState, set_current_state

    state = KVFlowState(CacheConfig(device_tokens=64, namespace_cap_tokens=10**6), 4)
    steps = {"a": 0, "b": 2, "c": 1}
    for agent in "abc":  # tags on the block hashes the chunks are keyed by
        state.on_request({"kvflow": {"workflow_id": "w", "agent": agent, "steps": steps}, "kvflow_prefix_tokens": 4},
                         [ord(agent)] * 4, [agent.encode()])
    set_current_state(state)
    keys = _fill(policy, ["a", "b", "c", "u1", "u2"])  # u1, u2: untagged, u2 most recent
    assert _names(policy.evict(3, protected={keys["u1"]}), keys) == ["u2", "b", "c"]
    assert policy.evict(3, protected=set()) is None  # two left: atomic refusal
    assert _names(policy.evict(2, protected=set()), keys) == ["u1", "a"]
    assert state.stats.evicted_host_tokens == 5 * 4


def test_without_a_kvflow_scheduler_the_host_tier_is_lru(policy) -> None:
    keys = _fill(policy, ["old", "mid", "new"])
    assert _names(policy.evict(2, protected=set()), keys) == ["old", "mid"]
