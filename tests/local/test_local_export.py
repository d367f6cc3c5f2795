"""``kvflow export-model`` writes a Hugging Face directory that loads back to the same model."""

from __future__ import annotations

import json

import torch

from backends.local.model.loader import load_model
from backends.local.pools import KVPool
from backends.local.runner import ModelRunner
from kvflow_orch.cli import main as kvflow


def _last_logits(loaded, ids):
    runner = ModelRunner(loaded.model, KVPool(loaded.model.cfg, 128, device="cpu", dtype=torch.float32), 64)
    return runner.prefill(ids, [], list(range(len(ids))))


def test_export_writes_a_loadable_hf_directory(tiny, tmp_path, capsys):
    out = tmp_path / "model"
    assert kvflow(["export-model", "tiny-random", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"] and tok_cfg["eos_token"] == "<|im_end|>"
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == tiny.tokenizer.token_id("<|im_end|>")
    again = load_model(str(out))
    ids = tiny.tokenizer.encode_chat([{"role": "user", "content": "hi"}]).input_ids
    assert torch.equal(_last_logits(again, list(ids)), _last_logits(tiny, list(ids)))
    assert again.tokenizer.render_chat([{"role": "user", "content": "hi"}], True) == tiny.tokenizer.render_chat(
        [{"role": "user", "content": "hi"}], True)


def test_export_refuses_to_overwrite_and_names_unknown_models(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("precious")
    assert kvflow(["export-model", "tiny-random", str(tmp_path)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert kvflow(["export-model", "gpt-17", str(tmp_path / "x")]) == 2
    assert "unknown model 'gpt-17'" in capsys.readouterr().err


def test_bfloat16_export_halves_the_weights(tmp_path):
    assert kvflow(["export-model", "tiny-random", str(tmp_path / "f32")]) == 0
    assert kvflow(["export-model", "tiny-random", str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    f32 = (tmp_path / "f32" / "model.safetensors").stat().st_size
    bf16 = (tmp_path / "bf16" / "model.safetensors").stat().st_size
    assert bf16 < 0.6 * f32
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
