"""Next-token choice: greedy (temperature 0) or temperature + top-p with a per-request generator."""

from __future__ import annotations

import torch

from backends.base import SamplingParams

__all__ = ["sample", "make_generator"]


def make_generator(params: SamplingParams, fallback_seed: int) -> torch.Generator | None:
    """A CPU generator for a sampled request (``None`` for greedy); ``params.seed`` makes it reproducible."""
    if params.temperature == 0:
        return None
    return torch.Generator().manual_seed(params.seed if params.seed is not None else fallback_seed)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """``logits`` is one row ``[vocab]``."""
    if params.temperature == 0 or generator is None:
        return int(torch.argmax(logits))
    # In float64 (a float32 temperature under 1e-45 is 0) and shifted by the max before dividing: a tiny
    # temperature then sends the other logits to -inf instead of every logit to +-inf, whose softmax is
    # NaN and made multinomial raise.
    row = logits.double().cpu()
    probs = torch.softmax((row - row.max()) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # keep the smallest head whose mass reaches top_p (always at least the top token)
        keep = (sorted_probs.cumsum(-1) - sorted_probs) < params.top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
