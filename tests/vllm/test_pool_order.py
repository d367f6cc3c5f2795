"""kvflow's order on vLLM's real BlockPool and FreeKVCacheBlockQueue (no engine, no model): freed
prefix blocks are stamped and reordered so the next allocation evicts untagged blocks first, then
agents by descending steps; steps updates re-rank blocks already in the free queue."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from vllm_server import HAVE_VLLM, SKIP_REASON  # noqa: E402

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


def test_tagged_prefixes_outlive_untagged_blocks_and_go_in_steps_order(parts) -> None:
    from backends.vllm_kvflow.scheduler import reorder_free_queue
    from kvflow_orch.protocol import StepsUpdate

    pool, state, run = _setup(parts)
    steps = {"a": 1, "b": 2, "c": 0}
    prefix = {agent: run(agent, [100 * (i + 1) + t for t in range(3 * BS)], _params(agent, steps))
              for i, agent in enumerate("abc")}
    prefix["u"] = run("u", [900 + t for t in range(3 * BS)])  # no hint: stock LRU would keep it longest
    assert all(_cached(pool, h) == 3 for h in prefix.values())
    assert state.counters["tagged_requests"] == 3 and state.counters["reorders"] > 0

    pool.get_new_blocks(3)  # the untagged prefix goes first, although it was used last
    assert [_cached(pool, prefix[x]) for x in "uabc"] == [0, 3, 3, 3]
    assert state.stats.evicted_device_tokens == 3 * BS
    pool.get_new_blocks(3)  # then the agent furthest from running (b: 2 steps)
    assert [_cached(pool, prefix[x]) for x in "abc"] == [3, 0, 3]

    # a steps update re-ranks blocks already in the free queue: c is done for now, a runs next
    state.apply_steps(StepsUpdate(workflow_id="wf", steps={"a": 0, "c": None}))
    assert reorder_free_queue(pool, state) == 6  # what the scheduler runs after a steps update
    pool.get_new_blocks(3)
    assert [_cached(pool, prefix[x]) for x in "ac"] == [3, 0]


def test_without_hints_the_pool_keeps_vllms_lru_order(parts) -> None:
    pool, state, run = _setup(parts)
    first = run("x", [1000 + t for t in range(6 * BS)])
    second = run("y", [2000 + t for t in range(6 * BS)])
    pool.get_new_blocks(6)
    assert (_cached(pool, first), _cached(pool, second)) == (0, 6)  # least recently freed first
    assert not state.tags and state.counters["reorders"] == 0
