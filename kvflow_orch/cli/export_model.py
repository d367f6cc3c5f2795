"""``kvflow export-model MODEL DIR``: write a built-in model as a Hugging Face directory
(:func:`backends.local.export.export_model`), so SGLang can serve exactly the embedded engine's weights."""

from __future__ import annotations

import argparse
import sys

from backends.local.export import EXPORT_DTYPES, export_model

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="smollm2-135m, tiny-random, or a Hugging Face directory")
    parser.add_argument("dir", help="output directory (created; must be empty unless --force)")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default="float32", help="weight dtype (default float32)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty directory")


def main(args: argparse.Namespace) -> int:
    print(f"kvflow export-model: reading {args.model} and writing {args.dir}...", file=sys.stderr, flush=True)
    try:
        out = export_model(args.model, args.dir, dtype=args.dtype, force=args.force)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"kvflow export-model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.model} to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0
