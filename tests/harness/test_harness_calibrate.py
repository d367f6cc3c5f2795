"""Calibration arithmetic: the line fit, and model profiles derived from the embedded engine's
configs agree with its real KV pools and with the bundled SmolLM2 profile."""

from __future__ import annotations

import pytest
import torch

from backends.local.model.llama import ModelConfig
from backends.local.pools import KVPool
from backends.sim.profiles import load_model
from kvflow_orch.harness.calibrate import fit_line, model_profile_of

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, tie_embeddings=True)


def test_fit_line_recovers_slope_and_intercept():
    a, b = fit_line([64, 256, 512, 1024], [0.5 + 0.01 * x for x in (64, 256, 512, 1024)])
    assert a == pytest.approx(0.5) and b == pytest.approx(0.01)


def test_profile_kv_bytes_match_the_engine_pool():
    prof = model_profile_of("smollm2-135m", SMOLLM2, dtype_bytes=4)
    pool = KVPool(SMOLLM2, 10, device="cpu", dtype=torch.float32)
    assert prof.kv_bytes_per_token == pool.bytes // 10 == load_model("smollm2-135m").kv_bytes_per_token


def test_profile_params_count_the_matmuls():
    prof = model_profile_of("smollm2-135m", SMOLLM2, dtype_bytes=4)
    # 30 layers x (q,o: 576*576*2 + k,v: 576*192*2 + mlp: 3*576*1536) + lm head 49152*576
    expected = 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536) + 49152 * 576
    assert prof.params == expected
    assert prof.params == pytest.approx(load_model("smollm2-135m").params, rel=0.01)
