"""The command line every app here shares: ``--base-url`` (the server's ``/v1`` URL), ``--model``
(default: the first model the server lists) and ``--sessions`` (how many runs)."""

from __future__ import annotations

import argparse

import httpx


def app_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's OpenAI-compatible URL, ending in /v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--sessions", type=int, default=1, help="how many runs (default 1)")
    return parser


def served_model(args: argparse.Namespace) -> str:
    return args.model or httpx.get(args.base_url.rstrip("/") + "/models", timeout=30).json()["data"][0]["id"]
