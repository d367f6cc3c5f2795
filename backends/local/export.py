"""``kvflow export-model MODEL DIR``: write a built-in model as a Hugging Face directory
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the chat template), so
SGLang (or transformers) can serve exactly the weights the embedded engine runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "main", "export_model"]

_EXPORT_DTYPES = ("float32", "bfloat16", "float16")


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="smollm2-135m, tiny-random, or a Hugging Face directory")
    parser.add_argument("dir", help="output directory (created; must be empty unless --force)")
    parser.add_argument("--dtype", choices=_EXPORT_DTYPES, default="float32", help="weight dtype (default float32)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")


def main(args: argparse.Namespace) -> int:
    try:
        out = export_model(args.model, args.dir, dtype=args.dtype, force=args.force)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"kvflow export-model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.model} to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0
