"""Write a built-in model as a Hugging Face directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with the chat template), so SGLang (or transformers) can serve
exactly the weights the embedded engine runs. ``kvflow export-model`` is the command line for it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["export_model", "EXPORT_DTYPES"]

EXPORT_DTYPES = ("float32", "bfloat16", "float16")
"""The ``dtype`` values :func:`export_model` accepts."""


def export_model(source: str, target: str | Path, *, dtype: str = "float32", force: bool = False) -> Path:
    """Write ``source`` (``smollm2-135m``, ``tiny-random`` or a HF directory) to ``target``."""
    import torch

    from backends.local.config import DTYPES
    from backends.local.model.hf import write_hf_dir
    from backends.local.model.loader import read_source

    out = Path(target)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise FileExistsError(f"{out} exists and is not an empty directory (use --force to overwrite)")
    cfg, state, tok = read_source(source)
    eos = next((t for t in ("<|im_end|>", "<|endoftext|>") if tok.token_id(t) is not None), None)
    if eos is None:
        eos = tok.tokenizer.id_to_token(min(tok.eos_token_ids))
    bos = "<|im_start|>" if tok.token_id("<|im_start|>") is not None else None
    with torch.no_grad():
        return write_hf_dir(out, cfg, state, tok, eos_token=eos, bos_token=bos, dtype=DTYPES[dtype])
