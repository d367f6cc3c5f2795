"""Shared pieces of the embedded-engine benchmarks: token-exact synthetic prompts, a runner for
request lists, and the machine's load average (benchmarks on a shared CPU must say how busy it was)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Iterable

from backends.base import GenerateRequest, GenerateResult, SamplingParams
from backends.local import Engine

__all__ = ["random_tokens", "sampling", "run_sequential", "load_average", "describe_machine"]

_WORDS = ("alpha beta gamma delta model cache agent prompt tensor planner review coder test write read "
          "layer token prefix graph step order stage queue batch").split()


def random_tokens(engine: Engine, n: int, seed: int) -> tuple[int, ...]:
    """``n`` token ids of plausible text (random words), different for every seed."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n:
        ids.extend(engine.tokenizer.encode(" ".join(rng.choice(_WORDS) for _ in range(64)) + " "))
    return tuple(ids[:n])


def sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run_sequential(engine: Engine, requests: Iterable[GenerateRequest]) -> list[GenerateResult]:
    async def main() -> list[GenerateResult]:
        return [await engine.generate(r) for r in requests]

    return asyncio.run(main())


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def describe_machine() -> str:
    import torch

    return (f"{time.strftime('%Y-%m-%d %H:%M:%S')}  torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{os.cpu_count()} CPUs, load average {load_average()}")
