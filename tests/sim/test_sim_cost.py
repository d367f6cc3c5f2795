"""The roofline cost model against times computed by hand, and the bundled profiles' KV arithmetic."""

from __future__ import annotations

import pytest

from backends.sim.cost import CostModel, Work
from backends.sim.profiles import (
    HardwareProfile,
    ModelProfile,
    ProfileError,
    available_profiles,
    device_kv_tokens,
    load_hardware,
    load_model,
)

# A toy model and device with round numbers:
#   kv bytes/token = 2 (K,V) * 2 layers * 1 kv head * 4 dims * 2 bytes = 32
#   attention FLOPs per (query, key) pair = 4 * 2 layers * 2 heads * 4 dims = 64
#   effective compute 1e12 * 0.5 = 5e11 FLOP/s, memory 1e11 * 0.5 = 5e10 B/s, link 1e9 * 0.5 = 5e8 B/s
TOY_MODEL = ModelProfile("toy", params=1e9, n_layers=2, hidden_size=8, n_heads=2, n_kv_heads=1, head_dim=4)
TOY_HW = HardwareProfile(
    "toy-gpu", peak_flops=1e12, mem_bandwidth=1e11, memory_bytes=4e9, link_bandwidth=1e9,
    mem_fraction=1.0, link_efficiency=0.5, link_latency_s=1e-3, compute_efficiency=0.5,
    memory_efficiency=0.5, step_overhead_s=1e-3,
)
COST = CostModel(TOY_HW, TOY_MODEL)


def test_toy_model_derived_sizes():
    assert TOY_MODEL.kv_bytes_per_token == 32
    assert TOY_MODEL.attention_flops_per_pair == 64
    assert TOY_MODEL.weight_bytes == 2e9


def test_prefill_is_compute_bound_and_matches_hand_computation():
    # FLOPs: 2 * 1e9 * 100 + 64 * (100 * 101 / 2) = 2e11 + 323200 -> / 5e11 s
    # bytes: 2e9 + 100 * 32 -> / 5e10 s = 0.04 s, below the compute time
    expected = (2e11 + 323_200) / 5e11 + 1e-3
    assert COST.prefill_time(100) == pytest.approx(expected, rel=1e-12)


def test_prefill_after_a_cached_prefix_pays_attention_over_the_context():
    # 5 new tokens after 1000 cached: pairs = 5 * 1000 + 15
    flops = 2e9 * 5 + 64 * (5_000 + 15)
    bytes_ = 2e9 + 1005 * 32
    expected = max(flops / 5e11, bytes_ / 5e10) + 1e-3
    assert COST.prefill_time(5, 1000) == pytest.approx(expected, rel=1e-12)
    assert bytes_ / 5e10 > flops / 5e11  # a short prefill is memory bound


def test_decode_step_is_memory_bound_and_weights_are_read_once_per_batch():
    one = (2e9 + 1001 * 32) / 5e10 + 1e-3
    assert COST.decode_time([1000]) == pytest.approx(one, rel=1e-12)
    two = (2e9 + 2 * 1001 * 32) / 5e10 + 1e-3
    assert COST.decode_time([1000, 1000]) == pytest.approx(two, rel=1e-12)
    assert COST.decode_time([1000, 1000]) < 2 * COST.decode_time([1000])


def test_mixed_batch_equals_the_roofline_of_the_summed_work():
    batch = [Work(100, 0), Work(1, 1000)]
    flops = COST.flops([Work(100, 0)]) + COST.flops([Work(1, 1000)])
    bytes_ = 2e9 + (100 + 1001) * 32
    assert COST.forward_time(batch) == pytest.approx(max(flops / 5e11, bytes_ / 5e10) + 1e-3)
    assert COST.forward_time([]) == 0.0


def test_transfer_time_is_latency_plus_bytes_over_effective_link():
    assert COST.transfer_time(1000) == pytest.approx(1e-3 + 32_000 / 5e8, rel=1e-12)
    assert COST.transfer_time(0) == 0.0
    assert COST.layer_time(2.0) == 1.0  # two layers


def test_bundled_profiles_kv_arithmetic():
    names = available_profiles()
    assert {"h100-sxm", "h200", "a10g"} <= set(names["hardware"])
    assert {"qwen2.5-32b", "llama-3.1-8b", "smollm2-135m"} <= set(names["model"])
    assert load_model("qwen2.5-32b").kv_bytes_per_token == 256 * 1024
    assert load_model("llama-3.1-8b").kv_bytes_per_token == 128 * 1024
    # Paper, 4.4: about 10 GB of KV beside Qwen2.5-32B's weights on an H100 -> ~40k tokens.
    tokens = device_kv_tokens(load_hardware("h100-sxm"), load_model("qwen2.5-32b"))
    assert 35_000 < tokens < 45_000


def test_bad_profiles_are_clear_errors(tmp_path):
    with pytest.raises(ProfileError, match="no hardware profile 'tpu'"):
        load_hardware("tpu")
    bad = tmp_path / "x.json"
    bad.write_text('{"kind": "model", "name": "x", "params": -1, "n_layers": 1, "hidden_size": 1,'
                   ' "n_heads": 1, "n_kv_heads": 1, "head_dim": 1}')
    with pytest.raises(ProfileError, match="params must be > 0"):
        load_model(bad)
    with pytest.raises(ProfileError, match="expected an object"):
        load_hardware(bad)
    with pytest.raises(ProfileError, match="do not fit"):
        device_kv_tokens(load_hardware("a10g"), load_model("qwen2.5-32b"))
