"""The plugin's per-process state: configuration checks, memory bounds, and a stats view that
reveals no prompts and no workflow ids (pure Python: runs in any venv)."""

from __future__ import annotations

import json

import pytest

from backends.kvcache.config import CacheConfig
from backends.sglang_kvflow.state import UNSIZED_POOL, KVFlowState, PluginConfig, PrefixKey


def test_config_from_policy_options_nests_the_brain_config():
    config = PluginConfig.from_options({"prefetch_lookahead": 2, "prefetch": False, "reserved_load_slots": 0})
    assert config.cache == CacheConfig(device_tokens=UNSIZED_POOL, prefetch_lookahead=2, prefetch=False,
                                       max_inflight_loads=2)
    assert config.reserved_load_slots == 0
    assert PluginConfig.from_options(config.as_options()) == config
    with pytest.raises(ValueError, match="lookahed"):
        PluginConfig.from_options({"lookahed": 2})
    # the brain's own validation, one message for the engine and the plugin
    for bad, names in (({"max_inflight_loads": -1}, "max_inflight_loads"), ({"hint_ttl_s": 0}, "hint_ttl_s"),
                       ({"namespace_cap_tokens": -5}, "namespace_cap_tokens")):
        with pytest.raises(ValueError, match=names):
            PluginConfig.from_options(bad)
    with pytest.raises(ValueError, match="reserved_load_slots"):
        PluginConfig(reserved_load_slots=-1)


def test_the_pool_size_completes_the_config_and_the_namespace_cap_rule_is_the_brains():
    state = KVFlowState(PluginConfig.from_options({"hint_ttl_s": 30}))
    assert state.hints.cap_tokens is None  # no pool known yet: nothing to take half of
    state.use_device_pool(1000)
    assert state.config.cache == CacheConfig(device_tokens=1000, hint_ttl_s=30, max_inflight_loads=2)
    assert state.hints.cap_tokens == state.config.cache.effective_namespace_cap == 500
    capped = KVFlowState(PluginConfig.from_options({"namespace_cap_tokens": 64}))
    assert capped.hints.cap_tokens == 64
    capped.use_device_pool(1000)
    assert capped.hints.cap_tokens == 64


def test_reconfiguring_with_the_same_options_keeps_the_sized_state():
    from backends.sglang_kvflow.state import configure, reset_state

    state = reset_state(PluginConfig.from_options({"prefetch_lookahead": 2}))
    state.use_device_pool(48)
    assert configure(PluginConfig.from_options({"prefetch_lookahead": 2})) is state  # one strategy per tree
    assert configure(PluginConfig.from_options({"prefetch_lookahead": 3})) is not state
    reset_state()


def _bounded_state(**bounds) -> KVFlowState:
    return KVFlowState(PluginConfig(cache=CacheConfig(device_tokens=UNSIZED_POOL, max_inflight_loads=2, **bounds)))


def test_prefix_records_are_the_brains_bounded_registry_newest_kept():
    state = _bounded_state(max_tracked_agents=3)
    for i in range(5):
        state.intake.remember(("ns", f"a{i}"), PrefixKey((i,), None, None), 1)
    state.intake.remember(("ns", "a2"), PrefixKey((9,), None, None), 1)  # refreshed: now the newest
    assert list(state.intake.prefixes) == [("ns", "a3"), ("ns", "a4"), ("ns", "a2")]
    assert state.hints.fixed_tokens(("ns", "a0")) == 0  # a forgotten agent costs no cap space any more
    state = _bounded_state(max_tracked_tokens=10)
    for i in range(4):
        state.intake.remember(("ns", f"a{i}"), PrefixKey((i,) * 4, None, None), 4)
    assert list(state.intake.prefixes) == [("ns", "a2"), ("ns", "a3")]  # 8 tokens; a third would make 12
    state.intake.remember(("ns", "long"), PrefixKey((7,) * 20, None, None), 20)
    assert list(state.intake.prefixes) == [("ns", "long")]  # alone over the bound, but the newest stays


def test_segmentation_and_prefix_records_are_bounded_by_the_tracked_tokens_of_the_sized_pool():
    state = KVFlowState()
    intake = state.intake
    unsized = CacheConfig(device_tokens=UNSIZED_POOL).tracked_tokens
    assert intake.segmenter.max_tokens == intake.prefixes.max_tokens == unsized  # not a 4M-token default
    state.use_device_pool(1 << 20)
    assert intake.segmenter.max_tokens == intake.prefixes.max_tokens == state.config.cache.tracked_tokens == 4 << 20
    assert intake.prefixes.max_agents == intake.segmenter.max_agents == state.config.cache.max_tracked_agents


def test_snapshot_reveals_no_prompts_or_workflow_ids():
    state = KVFlowState()
    state.hints.set_steps("tenant", "secret-workflow-42", {"coder": 1})
    state.intake.remember(("tenant", "coder"), PrefixKey((31337, 4242), "secret-extra", None), 2)
    text = json.dumps(state.snapshot())
    assert "secret" not in text and "31337" not in text and "coder" not in text
    assert state.snapshot()["workflows"] == 1 and state.snapshot()["agents_with_prefix"] == 1


def test_stats_of_several_dp_ranks_add_up_and_keep_one_config():
    from backends.sglang_kvflow.stats import merge_stats

    rank = KVFlowState(PluginConfig.from_options({"prefetch_lookahead": 2}))
    rank.counters["prefetch_issued"] = 3
    replies = [dict(rank.snapshot(), device={"free_tokens": None, "capacity_tokens": 100}),
               dict(rank.snapshot(), device={"free_tokens": 40, "capacity_tokens": 100})]
    merged = merge_stats(replies)
    assert merged["ranks"] == 2 and merged["counters"]["prefetch_issued"] == 6
    assert merged["device"] == {"free_tokens": 40, "capacity_tokens": 200}
    assert merged["config"] == rank.snapshot()["config"] and merged["config"]["prefetch_lookahead"] == 2
