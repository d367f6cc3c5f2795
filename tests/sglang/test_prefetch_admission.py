"""Prefetch and status-aware admission against SGLang's real HiCache (CPU, direct copies).

An agent's fixed prefix is demoted to host; when its steps come within the lookahead the plugin
loads it back with SGLang's load-back path. While the load is unacknowledged the tree already
reports the tokens as device hits (SGLang's "loading looks resident" trap), so the request must be
not ready and the prefill adder must skip it; after ``check_hicache_events`` it is ready and the KV
rows on device equal the rows that were offloaded.
"""

from __future__ import annotations

from array import array

import pytest

pytestmark = pytest.mark.sglang

FIXED = [1, 2, 3, 4, 5, 6, 7, 8]


def _hint(agent: str, steps: dict) -> dict:
    return {"kvflow": {"workflow_id": "wf", "agent": agent, "steps": steps}, "kvflow_fixed_tokens": len(FIXED)}


def _match(rig, tokens):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return rig.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))


def _scheduler(rig):
    """SGLang's Scheduler class over our cache: its hooked ``_process_hicache_events`` and
    ``get_prefill_adder_class`` run for real; the model-side state they never touch is absent."""
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    scheduler.tree_cache = rig.cache
    scheduler.enable_hierarchical_cache = True
    scheduler.enable_unified_cache_external_linker = scheduler.enable_lmcache = False
    scheduler.enable_hicache_storage = False
    return scheduler


def _adder(rig, scheduler):
    """What ``_get_new_batch_prefill_raw`` builds each iteration (batch-size limits left open)."""
    return scheduler.get_prefill_adder_class()(1, rig.cache, rig.allocator, None, 1.0, 4096, None)


def _queued(rig, tokens, custom_params=None):
    req = rig.make_req(tokens, custom_params)
    req.init_next_round_input(rig.cache)  # what the scheduler does before add_one_req
    return req


def test_prefetch_then_ready_with_the_offloaded_kv(make_rig, state):
    from sglang.srt.managers.schedule_policy import AddReqResult
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from backends.sglang_kvflow.hints_bridge import KVFlowStepsReq, handle_steps
    from backends.sglang_kvflow.hicache_prefetch import is_ready, prefetch_step
    from backends.sglang_kvflow.tags import on_request_queued

    rig = make_rig(size=32, policy="kvflow", hicache=True)
    req = rig.make_req(FIXED + [50, 51], _hint("A", {"A": 0, "B": 3}))
    on_request_queued(None, req)
    rig.run_req(req)
    offloaded = rig.kv_rows(rig.cache.path_device_indices(_match(rig, FIXED).last_device_node))

    rig.cache.evict(EvictParams(num_tokens=32))  # write-through: everything demoted to host
    m = _match(rig, FIXED)
    assert (m.device_prefix_len, m.host_hit_length) == (0, len(FIXED))
    scratch = rig.allocator.alloc(rig.allocator.available_size())
    rig.write_kv(scratch)  # scribble over every free row: a load must bring the real rows back
    rig.allocator.free(scratch)

    scheduler = _scheduler(rig)
    handle_steps(scheduler, KVFlowStepsReq(workflow_id="wf", namespace="default", steps={"A": 3, "B": 0}))
    scheduler._process_hicache_events()  # SGLang's per-iteration step + the plugin's AFTER hook
    assert state.counters["prefetch_issued"] == 0, "A is 3 steps away: beyond the default lookahead of 1"

    handle_steps(scheduler, KVFlowStepsReq(workflow_id="wf", namespace="default", steps={"A": 1, "B": 0}))
    scheduler._process_hicache_events()
    assert state.counters["prefetch_issued"] == 1 and len(state.inflight) == 1
    # The trap: the tokens already look device-resident while the copy is unacknowledged.
    m = _match(rig, FIXED)
    assert m.device_prefix_len == len(FIXED)
    assert not is_ready(rig.cache, m.last_device_node)
    rig.cache.sanity_check()  # SGLang's invariants hold with our load in flight

    adder = _adder(rig, scheduler)
    assert type(adder).__qualname__ == "KVFlowPrefillAdder[PrefillAdder]"
    waiting = _queued(rig, FIXED + [60, 61], _hint("A", {"A": 0}))
    assert adder.add_one_req(waiting, has_chunked_req=False, truncation_align_size=None) == AddReqResult.CONTINUE
    assert state.counters["admission_skips"] == 1 and waiting not in adder.can_run_list
    ready = _queued(rig, [90, 91, 92])  # shares nothing with the load: admitted now
    assert adder.add_one_req(ready, has_chunked_req=False, truncation_align_size=None) == AddReqResult.CONTINUE
    assert adder.can_run_list == [ready] and state.counters["admission_skips"] == 1

    scheduler._process_hicache_events()  # next iteration: SGLang reaps the ack, the hook retires it
    assert state.inflight == {} and state.counters["prefetched_tokens"] == len(FIXED)
    m = _match(rig, FIXED)
    assert is_ready(rig.cache, m.last_device_node)
    loaded = rig.kv_rows(rig.cache.path_device_indices(m.last_device_node))
    assert all((a == b).all() for a, b in zip(loaded, offloaded, strict=True))
    assert prefetch_step(rig.cache) == 0, "already on device: nothing more to load"
    rig.cache.sanity_check()


def test_prefetch_respects_slots_inflight_cap_and_quota(make_rig, state):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from backends.sglang_kvflow.hicache_prefetch import load_quota, prefetch_step
    from backends.sglang_kvflow.tags import on_request_queued

    rig = make_rig(size=40, policy="kvflow", hicache=True)
    agents = {"A": [1, 2, 3, 4, 5, 6], "B": [11, 12, 13, 14, 15, 16], "C": [21, 22, 23, 24, 25, 26]}
    steps = {"A": 1, "B": 1, "C": 0}
    for name, fixed in agents.items():
        hint = {"kvflow": {"workflow_id": "wf", "agent": name, "steps": steps}, "kvflow_fixed_tokens": 6}
        req = rig.make_req(fixed + [99], hint)
        on_request_queued(None, req)
        rig.run_req(req)
    rig.cache.evict(EvictParams(num_tokens=40))

    # max_inflight_loads=2 (default): C (steps 0) and then one of A/B, not all three.
    assert prefetch_step(rig.cache) == 2
    loading = {ref[1] for ref, *_ in state.inflight.values()}
    assert "C" in loading and len(loading & {"A", "B"}) == 1
    rig.cache.check_hicache_events()
    prefetch_step(rig.cache)

    # The quota never counts tokens more urgent than the agent: C's prefix (steps 0) is
    # device-resident now and must not be offered to a prefetch for an agent at steps 1.
    rig.run_req(rig.make_req([70, 71, 72, 73]))  # an untagged suffix on device: evictable before any prefix
    free = rig.allocator.available_size()
    quota = load_quota(rig.cache, state, ("default", "A"))
    assert quota == free + 4
    assert load_quota(rig.cache, state, ("default", "Z")) == free  # unhinted: only free space qualifies
    # the brain's rule reads SGLang's tree only as far as the load needs
    assert load_quota(rig.cache, state, ("default", "A"), need=free) == free
    assert free < load_quota(rig.cache, state, ("default", "A"), need=free + 1) <= quota


def test_untagged_requests_are_never_blocked(make_rig, state):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from backends.sglang_kvflow.hicache_prefetch import is_ready, prefetch_step
    from backends.sglang_kvflow.tags import on_request_queued

    rig = make_rig(size=32, policy="kvflow", hicache=True)
    req = rig.make_req(FIXED + [50], _hint("A", {"A": 1}))
    on_request_queued(None, req)
    rig.run_req(req)
    rig.cache.evict(EvictParams(num_tokens=32))
    rig.run_req(rig.make_req([7, 7, 7, 7]))
    assert prefetch_step(rig.cache) == 1  # a prefetch in flight: readiness now walks the path
    assert not is_ready(rig.cache, _match(rig, FIXED).last_device_node)
    assert is_ready(rig.cache, _match(rig, [7, 7, 7, 7]).last_device_node)
    assert is_ready(rig.cache, None)


def test_looking_for_a_prefix_to_prefetch_leaves_recency_alone(make_rig, state):
    """SGLang's match_prefix stamps the matched path as just used; a prefetch's look-up is no use
    of the prefix, so LRU order among equally hinted nodes stays as the requests left it."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from backends.sglang_kvflow.hicache_prefetch import prefetch_step
    from backends.sglang_kvflow.tags import on_request_queued

    rig = make_rig(size=32, policy="kvflow", hicache=True)
    req = rig.make_req(FIXED + [50], _hint("A", {"A": 1}))
    on_request_queued(None, req)
    rig.run_req(req)
    rig.cache.evict(EvictParams(num_tokens=32))
    rig.run_req(rig.make_req([7, 7, 7, 7]))  # used after A: the more recent of the two

    def times():
        out, stack = {}, list(rig.cache.tree_core.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            out[tuple(node.key.token_ids[:2])] = node.last_access_time
        return out

    before = times()
    assert prefetch_step(rig.cache) == 1
    assert times() == before
    assert before[(1, 2)] < before[(7, 7)]
