"""Seeded, skewed routing shared by the supervisor and swarm workflows.

A draw is a pure function of its key, so a run takes the same route in the DSL, in the LangGraph
app and in the simulator (which gets the weights, not the code, from :func:`routing` functions).
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Mapping, Sequence

__all__ = ["zipf_weights", "draw", "named_choice"]


def zipf_weights(k: int, s: float) -> list[float]:
    """Zipf weights ``1 / rank**s`` for ranks 1..k, normalised."""
    if k < 1:
        raise ValueError(f"need at least one target, got {k}")
    if s < 0:
        raise ValueError(f"the Zipf exponent must be >= 0, got {s}")
    raw = [1 / (rank**s) for rank in range(1, k + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def draw(weights: Mapping[str, float], *key: object) -> str:
    """A target drawn by ``weights`` from a random stream seeded by ``key``."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    names = list(weights)
    return rng.choices(names, [weights[n] for n in names])[0]


def named_choice(reply: str, names: Sequence[str]) -> str | None:
    """The target a model's reply names as ``NEXT: <name>``, if it is one of ``names``."""
    match = re.search(r"NEXT:\s*([A-Za-z0-9_\-]+)", reply or "")
    return match.group(1) if match and match.group(1) in names else None
