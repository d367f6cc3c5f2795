"""Read and write Hugging Face model directories (config.json + safetensors + tokenizer files).

Supported architectures: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (q/k/v biases). The writer
produces a directory that transformers and SGLang load as a Llama model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from backends.local.model.llama import ModelConfig
from backends.local.tokenizer import ChatTokenizer

__all__ = ["read_hf_dir", "write_hf_dir", "is_hf_dir"]

_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def is_hf_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def _config_from_hf(raw: Mapping[str, Any], where: Path) -> ModelConfig:
    arch = (raw.get("architectures") or ["?"])[0]
    if arch not in _ARCHS:
        raise ValueError(f"{where}: architecture {arch!r} is not supported; expected one of {sorted(_ARCHS)}")
    if raw.get("rope_scaling"):
        raise ValueError(f"{where}: rope_scaling {raw['rope_scaling']!r} is not supported")
    missing = [k for k in _REQUIRED_FIELDS if k not in raw]
    if missing:
        raise ValueError(f"{where}: config.json lacks {', '.join(missing)}")
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    kind = _ARCHS[arch]
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=kind == "qwen2" or bool(raw.get("attention_bias", False)),
        max_position=int(raw.get("max_position_embeddings", 8192)),
        architecture=kind,
    )


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: missing weight file {name}")
        try:
            state.update(load_file(str(path / name)))
        except Exception as exc:  # SafetensorError, or an OSError for an unreadable file
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"{path / name}: not a readable safetensors file ({first}); delete it or "
                             "replace it with a good copy") from None
    return {k.removeprefix("model."): v for k, v in state.items()}


def _eos_ids(path: Path, raw: Mapping[str, Any], tok: Tokenizer, tok_cfg: Mapping[str, Any]) -> frozenset[int]:
    ids: set[int] = set()
    sources = [raw]
    if (path / "generation_config.json").is_file():
        sources.append(json.loads((path / "generation_config.json").read_text()))
    for src in sources:
        value = src.get("eos_token_id")
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    eos = tok_cfg.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    for name in (eos, "<|im_end|>", "<|endoftext|>"):
        found = tok.token_to_id(name) if name else None
        if found is not None:
            ids.add(found)
    return frozenset(ids)


def read_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], ChatTokenizer]:
    p = Path(path)
    raw = json.loads((p / "config.json").read_text())
    cfg = _config_from_hf(raw, p)
    if not (p / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{p}: tokenizer.json is missing")
    tok = Tokenizer.from_file(str(p / "tokenizer.json"))
    tok_cfg = json.loads((p / "tokenizer_config.json").read_text()) if (p / "tokenizer_config.json").is_file() else {}
    template = tok_cfg.get("chat_template")
    if (p / "chat_template.jinja").is_file():
        template = (p / "chat_template.jinja").read_text()
    return cfg, _load_weights(p), ChatTokenizer(tok, template, _eos_ids(p, raw, tok, tok_cfg))


def write_hf_dir(path: str | Path, cfg: ModelConfig, state: Mapping[str, torch.Tensor], tok: ChatTokenizer,
                 *, eos_token: str, bos_token: str | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``cfg``/``state`` (our parameter names) as a Llama HF directory; returns the path."""
    if cfg.architecture != "llama":
        raise ValueError("only Llama models can be exported")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    eos_id = tok.token_id(eos_token)
    if eos_id is None:
        raise ValueError(f"eos token {eos_token!r} is not in the vocabulary")
    bos_id = tok.token_id(bos_token) if bos_token else None
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "max_position_embeddings": cfg.max_position, "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id,
        "torch_dtype": str(dtype).removeprefix("torch."), "initializer_range": 0.02, "use_cache": True,
    }
    (p / "config.json").write_text(json.dumps(config, indent=2))
    (p / "generation_config.json").write_text(json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_id}, indent=2))
    tensors = {f"model.{k}" if k != "lm_head.weight" else k: v.to(dtype).contiguous() for k, v in state.items()}
    if cfg.tie_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(p / "model.safetensors"), metadata={"format": "pt"})
    tok.tokenizer.save(str(p / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tok.chat_template,
        "bos_token": bos_token, "eos_token": eos_token, "pad_token": eos_token,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_position,
    }
    (p / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    return p
