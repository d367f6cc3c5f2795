"""Next-token choice: greedy (temperature 0) or temperature + top-k / min-p / top-p with a
per-request generator, after the logit-shaping options (logit bias, presence / frequency /
repetition penalties); and the log-probabilities a request asked for."""

from __future__ import annotations

from typing import Sequence

import torch

from backends.base import SamplingParams, TokenLogprob

__all__ = ["sample", "make_generator", "shape_logits", "token_logprob"]


def make_generator(params: SamplingParams, fallback_seed: int) -> torch.Generator | None:
    """A CPU generator for a sampled request (``None`` for greedy); ``params.seed`` makes it reproducible."""
    if params.temperature == 0:
        return None
    return torch.Generator().manual_seed(params.seed if params.seed is not None else fallback_seed)


def shape_logits(logits: torch.Tensor, params: SamplingParams, prompt: Sequence[int],
                 outputs: Sequence[int]) -> torch.Tensor:
    """``logits`` ``[vocab]`` with the bias and penalties applied (float64 on the CPU); unchanged
    when no option shapes them. Presence / frequency count the output only (OpenAI); repetition
    counts prompt and output (as in SGLang and vLLM)."""
    if not params.shapes_logits:
        return logits
    row = logits.double().cpu().clone()
    if params.repetition_penalty != 1.0 and (prompt or outputs):
        seen = torch.tensor(sorted(set(prompt) | set(outputs)), dtype=torch.long)
        picked = row[seen]
        row[seen] = torch.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
    if outputs and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(outputs, dtype=torch.long), minlength=row.numel()).double()
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).double()
    for token, bias in params.logit_bias:
        row[token] += bias
    # An extreme penalty (dividing by 1e-300) overflows to inf, and inf - inf is NaN in the softmax.
    return row.clamp(-1e300, 1e300)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """``logits`` is one row ``[vocab]`` (already shaped by :func:`shape_logits`)."""
    if params.temperature == 0 or generator is None:
        return int(torch.argmax(logits))
    # In float64 (a float32 temperature under 1e-45 is 0) and shifted by the max before dividing: a tiny
    # temperature then sends the other logits to -inf instead of every logit to +-inf, whose softmax is
    # NaN and made multinomial raise.
    row = logits.double().cpu()
    probs = torch.softmax((row - row.max()) / params.temperature, dim=-1)
    if 0 < params.top_k < probs.numel():
        probs[probs < probs.topk(params.top_k).values[-1]] = 0.0
    if params.min_p > 0:
        probs[probs < params.min_p * probs.max()] = 0.0
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # keep the smallest head whose mass reaches top_p (always at least the top token)
        keep = (sorted_probs.cumsum(-1) - sorted_probs) < params.top_p * sorted_probs.sum()
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The chosen token's log-probability and the ``top`` most likely tokens', in the model's own
    distribution (raw logits: before temperature, penalties, bias and truncation)."""
    logp = torch.log_softmax(logits.double().cpu(), dim=-1)
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = logp.topk(min(top, logp.numel()))
        alternatives = tuple((int(i), float(v)) for i, v in zip(ids, values, strict=True))
    return TokenLogprob(token, float(logp[token]), alternatives)
