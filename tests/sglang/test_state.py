"""The plugin's per-process state: configuration checks, memory bounds, and a stats view that
reveals no prompts and no workflow ids (pure Python: runs in any venv)."""

from __future__ import annotations

import json

import pytest

from backends.sglang_kvflow.state import KVFlowState, PluginConfig, PrefixKey


def test_config_from_policy_options_rejects_unknown_and_bad_values():
    assert PluginConfig.from_options({"prefetch_lookahead": 2, "prefetch": False}) == PluginConfig(prefetch_lookahead=2, prefetch=False)
    with pytest.raises(ValueError, match="lookahed"):
        PluginConfig.from_options({"lookahed": 2})
    with pytest.raises(ValueError, match=">= 0"):
        PluginConfig(max_inflight_loads=-1)


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

    rank = KVFlowState(PluginConfig(prefetch_lookahead=2))
    rank.counters["prefetch_issued"] = 3
    replies = [dict(rank.snapshot(), device={"free_tokens": None, "capacity_tokens": 100}),
               dict(rank.snapshot(), device={"free_tokens": 40, "capacity_tokens": 100})]
    merged = merge_stats(replies)
    assert merged["ranks"] == 2 and merged["counters"]["prefetch_issued"] == 6
    assert merged["device"] == {"free_tokens": 40, "capacity_tokens": 200}
    assert merged["config"] == rank.snapshot()["config"] and merged["config"]["prefetch_lookahead"] == 2
