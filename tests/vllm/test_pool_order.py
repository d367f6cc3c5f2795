"""The pool hooks' mechanics on vLLM's real BlockPool and FreeKVCacheBlockQueue (no engine, no
model): what they count and which blocks a reorder moves. The eviction order itself is the eviction
spec's (tests/conformance/test_eviction_order.py), which the whole KVFlowScheduler runs with the same
scenarios as the brain and SGLang."""

from __future__ import annotations


import pytest

from vllm_server import HAVE_VLLM, SKIP_REASON

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)]

BS = 4


@pytest.fixture
def parts():
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BS, sha256)

    def request(rid: str, tokens: list[int], kvflow: dict | None = None) -> Request:
        params = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": kvflow} if kvflow else None)
        return Request(rid, tokens, params, None, block_hasher=hasher)

    return BlockPool, request


def _setup(parts, blocks: int = 13):
    from backends.kvcache.config import CacheConfig
    from backends.vllm_kvflow.scheduler import install_pool_hooks, reorder_free_queue
    from backends.vllm_kvflow.state import KVFlowState

    BlockPool, request = parts
    pool = BlockPool(num_gpu_blocks=blocks, enable_caching=True, hash_block_size=BS)
    state = KVFlowState(CacheConfig(device_tokens=(blocks - 1) * BS, namespace_cap_tokens=10**6), BS)
    install_pool_hooks(pool, state, lambda: reorder_free_queue(pool, state))

    def run(rid: str, tokens: list[int], kvflow: dict | None = None) -> list:
        """What the scheduler does for one request: apply its hint, allocate, cache, free."""
        req = request(rid, tokens, kvflow)
        state.on_request(req.kv_transfer_params, req.prompt_token_ids, req.block_hashes)
        reorder_free_queue(pool, state)
        n = len(tokens) // BS
        blocks_ = pool.get_new_blocks(n)
        pool.cache_full_blocks(req, blocks_, 0, n, BS, 0)
        pool.free_blocks(reversed(blocks_))
        return req.block_hashes

    return pool, state, run


def _cached(pool, hashes) -> int:
    return sum(pool.get_cached_block(h, [0]) is not None for h in hashes)


def _params(agent: str, steps: dict) -> dict:
    return {"kvflow": {"workflow_id": "wf", "agent": agent, "steps": steps}, "kvflow_prefix_tokens": 3 * BS}


def test_hooks_count_tags_reorders_and_evicted_tokens(parts) -> None:
    from backends.vllm_kvflow.scheduler import reorder_free_queue
    from kvflow_orch.protocol import StepsUpdate

    pool, state, run = _setup(parts)
    steps = {"a": 1, "b": 2, "c": 0}
    for i, agent in enumerate("abc"):
        run(agent, [100 * (i + 1) + t for t in range(3 * BS)], _params(agent, steps))
    run("u", [900 + t for t in range(3 * BS)])  # no hint: nothing tagged
    assert state.counters["tagged_requests"] == 3 and state.counters["reorders"] > 0
    assert len(state.tags) == 9

    pool.get_new_blocks(6)  # evicts cached blocks, counted in tokens
    assert state.stats.evicted_device_tokens == 6 * BS
    # a steps update moves every free tagged block still cached (and nothing else)
    state.apply_steps(StepsUpdate(workflow_id="wf", steps={"a": 0, "c": None}))
    assert reorder_free_queue(pool, state) == 6


def test_without_hints_nothing_is_tagged_or_reordered(parts) -> None:
    pool, state, run = _setup(parts)
    run("x", [1000 + t for t in range(6 * BS)])
    run("y", [2000 + t for t in range(6 * BS)])
    pool.get_new_blocks(6)
    assert not state.tags and state.counters["reorders"] == 0
    assert state.stats.evicted_device_tokens == 6 * BS
