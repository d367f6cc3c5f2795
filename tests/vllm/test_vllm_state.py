"""The vLLM backend's engine-side state without vLLM: hints from kv_transfer_params, tags on block
hashes, and the order the scheduler gives the free queue (the brain's kvflow_key)."""

from __future__ import annotations

import math

import pytest

from backends.kvcache.config import CacheConfig
from backends.vllm_kvflow import CONFIG_ENV
from backends.vllm_kvflow.state import HINT_KEY, PREFIX_TOKENS_KEY, KVFlowState, cache_config_from_env, read_hint
from kvflow_orch.protocol import HintError, KVFlowHint, StepsUpdate

BS = 4  # tokens per block


def _state(device_tokens: int = 64, **options) -> KVFlowState:
    return KVFlowState(CacheConfig(device_tokens=device_tokens, **options), BS)


def _params(agent: str, steps: dict, prefix_tokens: int | None = None, wf: str = "wf") -> dict:
    hint = KVFlowHint(workflow_id=wf, agent=agent, steps=steps).model_dump(mode="json")
    return {HINT_KEY: hint, **({} if prefix_tokens is None else {PREFIX_TOKENS_KEY: prefix_tokens})}


def _hashes(agent: str, n: int) -> list[str]:
    return [f"{agent}-{i}" for i in range(n)]


def test_read_hint_returns_none_without_a_hint_and_names_bad_fields() -> None:
    assert read_hint(None) is None and read_hint({"do_remote_prefill": False}) is None
    hint, tokens = read_hint(_params("a", {"a": 0}, 8))
    assert (hint.agent, tokens) == ("a", 8)
    with pytest.raises(HintError, match="agent"):
        read_hint({HINT_KEY: {"workflow_id": "w"}})
    with pytest.raises(HintError, match=PREFIX_TOKENS_KEY):
        read_hint({**_params("a", {"a": 0}), PREFIX_TOKENS_KEY: -1})


def test_only_full_blocks_of_the_fixed_prefix_are_tagged() -> None:
    state = _state()
    ref = state.on_request(_params("coder", {"coder": 0}, prefix_tokens=10), list(range(20)), _hashes("c", 5))
    assert ref == ("default", "coder")
    assert set(state.tags) == {"c-0", "c-1"}  # 10 tokens = 2 full blocks of 4
    assert state.hints.fixed_tokens(ref) == 8


def test_without_an_explicit_boundary_the_segmenter_finds_the_shared_prefix() -> None:
    state = _state()
    state.on_request(_params("qa", {"qa": 0}), [1] * 9 + [2, 3], _hashes("q", 2))
    assert not state.tags  # one request cannot tell fixed from dynamic
    state.on_request(_params("qa", {"qa": 0}), [1] * 9 + [5, 6], _hashes("q", 2))
    assert set(state.tags) == {"q-0", "q-1"}  # 9 shared tokens -> 2 full blocks


def test_what_an_agent_repeats_beyond_its_declared_prefix_is_tagged_from_its_second_request() -> None:
    # an Engineer in a fix loop: fixed prompt (8 tokens declared), then the same design (8 tokens)
    # every round, then what changes (the brain's intake rule: the declaration is a floor)
    state = _state()
    system, design = [1] * 8, [2] * 8
    state.on_request(_params("eng", {"eng": 0}, prefix_tokens=8), system + design + [3] * 4, _hashes("e", 5))
    assert set(state.tags) == {"e-0", "e-1"}  # first request: the declared prefix only
    state.on_request(_params("eng", {"eng": 0}, prefix_tokens=8), system + design + [4] * 6, _hashes("e", 5))
    assert set(state.tags) == {f"e-{i}" for i in range(4)}  # + the 2 blocks of the repeated design
    assert state.hints.fixed_tokens(("default", "eng")) == 16
    assert state.intake.prefixes.get(("default", "eng")) == ("e-0", "e-1", "e-2", "e-3")  # the registry's record
    # a request sharing less than the declared prefix still tags the declared prefix
    state.on_request(_params("eng", {"eng": 0}, prefix_tokens=8), system + [9] * 12, _hashes("f", 5))
    assert {"f-0", "f-1"} <= set(state.tags) and "f-2" not in state.tags
    assert state.counters["hinted_requests"] == state.counters["tagged_requests"] == 3


def test_unhinted_requests_are_counted_and_tag_nothing() -> None:
    state = _state()
    assert state.on_request({"do_remote_prefill": False}, [1] * 8, _hashes("u", 2)) is None
    assert state.counters["unhinted_requests"] == 1 and not state.tags
    assert state.snapshot()["unhinted_requests"] == 1


def test_malformed_hint_is_counted_and_ignored() -> None:
    state = _state()
    assert state.on_request({HINT_KEY: {"agent": ""}}, [1, 2, 3, 4], ["h"]) is None
    assert state.counters["bad_hints"] == 1 and not state.tags


def test_order_follows_kvflow_key_sooner_steps_evicted_last() -> None:
    state = _state(device_tokens=1000)
    steps = {"pm": 2, "coder": 0, "qa": 1, "gone": None}
    for agent in steps:
        state.on_request(_params(agent, steps, prefix_tokens=4), [hash(agent)] * 4, [agent])
    state.tags.put("untagged?", set())  # a block whose tags were cleared counts as untagged
    for h in ["coder", "qa", "pm", "gone", "untagged?"]:
        state.note_freed(h)
    order = state.order([(h, h) for h in ["coder", "qa", "pm", "gone", "untagged?"]])
    assert order == ["untagged?", "gone", "pm", "qa", "coder"]
    # A steps update re-ranks: coder is done for now, pm runs next.
    state.apply_steps(StepsUpdate(workflow_id="wf", steps={"pm": 0, "coder": None, "qa": 1}))
    assert state.order([(h, h) for h in ["coder", "qa", "pm"]]) == ["coder", "qa", "pm"]
    # done forgets the workflow: every tagged block falls back to LRU among the unhinted.
    state.apply_steps(StepsUpdate(workflow_id="wf", done=True))
    assert state.snapshot()["workflows"] == 0
    assert state.order([(h, h) for h in ["pm", "coder", "qa"]]) == ["coder", "qa", "pm"]


def test_namespace_cap_is_half_the_pool_and_min_is_taken_across_workflows() -> None:
    state = _state(device_tokens=16)  # cap = 8 tokens = 2 blocks
    assert state.snapshot()["namespace_cap_tokens"] == 8
    state.on_request(_params("b", {"a": 1, "b": 0}, 8, wf="other"), [2] * 8, _hashes("b", 2))
    state.on_request(_params("a", {"a": 0, "b": 3}, 8), [1] * 8, _hashes("a", 2))
    # b: min(0 in "other", 3 in "wf") = 0; a: min(1, 0) = 0 as well; the 8-token cap protects one.
    assert state.hints.raw_steps(("default", "b")) == 0 == state.hints.raw_steps(("default", "a"))
    assert [state.hints.steps(("default", x)) for x in "ab"] == [0, math.inf]
    assert state.order([("b-0", "b"), ("a-0", "a")]) == ["b", "a"]


def test_tag_table_is_bounded() -> None:
    state = KVFlowState(CacheConfig(device_tokens=64), BS, max_tagged_blocks=3)
    state.on_request(_params("a", {"a": 0}, 20), [1] * 20, _hashes("a", 5))
    assert list(state.tags) == ["a-2", "a-3", "a-4"]
    with pytest.raises(ValueError, match="block_size"):
        KVFlowState(CacheConfig(device_tokens=64), 0)


def test_snapshot_reports_the_brain_counters() -> None:
    snap = _state().snapshot()
    for name in ("device_hit_tokens", "recomputed_tokens", "evicted_device_tokens", "workflows", "hinted_requests"):
        assert snap[name] == 0


def test_scheduler_options_come_from_the_environment_over_the_real_pool() -> None:
    config = cache_config_from_env(640, {CONFIG_ENV: '{"hint_ttl_s": 30, "namespace_cap_tokens": 64}'})
    assert config == CacheConfig(device_tokens=640, hint_ttl_s=30, namespace_cap_tokens=64)
    assert cache_config_from_env(640, {}) == CacheConfig(device_tokens=640)
    for raw, message in (('{"lookahed": 1}', f"unknown kvflow option\\(s\\) lookahed in {CONFIG_ENV}; known: "),
                         ('{"device_tokens": 9}', "unknown kvflow option\\(s\\) device_tokens"),  # the pool's own
                         ('{"hint_ttl_s": "soon"}', "hint_ttl_s must be a number"),
                         ('{"policy": "lru"}', "kvflow policy only"), ("[1]", "JSON object"), ("{", "not valid JSON")):
        with pytest.raises(ValueError, match=message):
            cache_config_from_env(640, {CONFIG_ENV: raw})
