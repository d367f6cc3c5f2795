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


def test_prefix_table_is_bounded_and_keeps_the_recent_agents():
    state = KVFlowState()
    state.hints.max_agents = 3
    for i in range(5):
        state.remember_prefix(("ns", f"a{i}"), PrefixKey((i,), None, None))
    state.remember_prefix(("ns", "a2"), PrefixKey((9,), None, None))  # refreshed: now the newest
    assert list(state.prefixes) == [("ns", "a3"), ("ns", "a4"), ("ns", "a2")]


def test_prefix_table_is_bounded_in_tokens_too():
    state = KVFlowState()
    state.max_prefix_tokens = 10
    for i in range(4):
        state.remember_prefix(("ns", f"a{i}"), PrefixKey((i,) * 4, None, None))
    assert list(state.prefixes) == [("ns", "a2"), ("ns", "a3")]  # 8 tokens; a third would make 12
    state.remember_prefix(("ns", "long"), PrefixKey((7,) * 20, None, None))
    assert list(state.prefixes) == [("ns", "long")]  # alone over the bound, but the newest stays


def test_snapshot_reveals_no_prompts_or_workflow_ids():
    state = KVFlowState()
    state.hints.set_steps("tenant", "secret-workflow-42", {"coder": 1})
    state.remember_prefix(("tenant", "coder"), PrefixKey((31337, 4242), "secret-extra", None))
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
