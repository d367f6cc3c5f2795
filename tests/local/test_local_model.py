"""The decoder and its loaders: reusing a cached prefix, chunking and batching give the logits of a
from-scratch forward; tiny-random is deterministic; HF directories (Llama, Qwen2) round-trip."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from backends.local.model.hf import read_hf_dir, write_hf_dir
from backends.local.model.llama import build_batch
from backends.local.model.loader import TINY_RANDOM_CONFIG, load_model
from backends.local.pools import KVPool
from backends.local.runner import ModelRunner

TEXT = "The quick brown fox jumps over the lazy dog; then it naps under a tree for a while."


def _fresh(tiny, chunk=4096):
    return ModelRunner(tiny.model, KVPool(tiny.model.cfg, 1024, device="cpu", dtype=torch.float32), chunk)


def test_tiny_random_is_seeded(tiny):
    again = load_model("tiny-random", seed=0)
    other = load_model("tiny-random", seed=1)
    for name, w in tiny.model.state_dict().items():
        assert torch.equal(w, again.model.state_dict()[name]), name
    assert not torch.equal(tiny.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert tiny.model.cfg == TINY_RANDOM_CONFIG


def test_prefix_reuse_and_chunking_match_from_scratch(tiny):
    ids = tiny.tokenizer.encode(TEXT)
    n, p = len(ids), 30
    reference = _fresh(tiny).prefill(ids, [], list(range(n)))
    # prefix computed into scattered slots, then the rest extends it
    runner = _fresh(tiny)
    prefix_slots = list(range(900, 900 - p, -1))
    runner.prefill(ids[:p], [], prefix_slots)
    extended = runner.prefill(ids[p:], prefix_slots, list(range(100, 100 + n - p)))
    chunked = _fresh(tiny, chunk=7).prefill(ids, [], list(range(n)))
    for logits in (extended, chunked):
        torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
        assert int(logits.argmax()) == int(reference.argmax())


def test_batched_decode_matches_single_sequence_decode(tiny):
    a, b = tiny.tokenizer.encode(TEXT), tiny.tokenizer.encode("short prompt")
    runner = _fresh(tiny)
    runner.prefill(a, [], list(range(len(a))))
    runner.prefill(b, [], list(range(500, 500 + len(b))))
    ctx_a = list(range(len(a) + 1))
    ctx_b = list(range(500, 500 + len(b) + 1))
    batched = runner.decode([5, 9], [ctx_a, ctx_b])
    alone_a = runner.decode([5], [ctx_a])
    alone_b = runner.decode([9], [ctx_b])
    torch.testing.assert_close(batched[0], alone_a[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(batched[1], alone_b[0], atol=1e-4, rtol=1e-4)


def test_ragged_batch_rejects_inconsistent_input():
    with pytest.raises(ValueError, match="new tokens"):
        build_batch([[1, 2, 3]], [[0, 1]], "cpu")
    with pytest.raises(ValueError, match="new tokens"):
        build_batch([[]], [[0]], "cpu")


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'gpt-17'"):
        load_model("gpt-17")


def _logits(loaded, ids):
    runner = ModelRunner(loaded.model, KVPool(loaded.model.cfg, 256, device="cpu", dtype=torch.float32), 64)
    return runner.prefill(ids, [], list(range(len(ids))))


def test_hf_directory_round_trip(tiny, tmp_path):
    write_hf_dir(tmp_path, tiny.model.cfg, tiny.model.state_dict(), tiny.tokenizer, eos_token="<|im_end|>")
    loaded = load_model(str(tmp_path))
    ids = tiny.tokenizer.encode(TEXT)
    assert torch.equal(_logits(loaded, ids), _logits(tiny, ids))
    assert loaded.tokenizer.encode(TEXT) == ids
    assert loaded.tokenizer.eos_token_ids == tiny.tokenizer.eos_token_ids
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2


def test_qwen2_directory_uses_qkv_biases(tiny, tmp_path):
    write_hf_dir(tmp_path, tiny.model.cfg, tiny.model.state_dict(), tiny.tokenizer, eos_token="<|im_end|>")
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg, state, _ = read_hf_dir(tmp_path)
    tensors = {f"model.{k}" if k != "lm_head.weight" else k: v for k, v in state.items()}
    for proj in ("q_proj", "k_proj", "v_proj"):
        key = f"model.layers.0.self_attn.{proj}.bias"
        tensors[key] = torch.zeros(state[f"layers.0.self_attn.{proj}.weight"].shape[0])
    tensors["model.layers.1.self_attn.q_proj.bias"] = torch.ones(cfg.num_heads * cfg.head_dim)
    for proj in ("k_proj", "v_proj"):
        tensors[f"model.layers.1.self_attn.{proj}.bias"] = torch.zeros(cfg.num_kv_heads * cfg.head_dim)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    qwen = load_model(str(tmp_path))
    assert qwen.model.cfg.attention_bias and qwen.model.cfg.architecture == "qwen2"
    assert torch.equal(qwen.model.layers[1].self_attn.q_proj.bias, torch.ones(cfg.num_heads * cfg.head_dim))
    ids = tiny.tokenizer.encode(TEXT)
    assert not torch.allclose(_logits(qwen, ids), _logits(tiny, ids))  # the bias is really applied


def test_unsupported_architecture_names_it(tiny, tmp_path):
    write_hf_dir(tmp_path, tiny.model.cfg, tiny.model.state_dict(), tiny.tokenizer, eos_token="<|im_end|>")
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="MambaForCausalLM"):
        load_model(str(tmp_path))


def test_config_missing_a_field_names_it(tiny, tmp_path):
    write_hf_dir(tmp_path, tiny.model.cfg, tiny.model.state_dict(), tiny.tokenizer, eos_token="<|im_end|>")
    config = json.loads((tmp_path / "config.json").read_text())
    del config["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json lacks num_attention_heads"):
        load_model(str(tmp_path))
