"""Sampling parameters: the part of an LLM call both sides of the wire agree on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Sampling"]

# Options sent on the wire only when they differ from these values.
_NEUTRAL = {"top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of an LLM call: an agent's defaults, and what a serving engine receives
    (``backends.base.SamplingParams`` is this class)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0
    """Keep the ``top_k`` most likely tokens (0: all)."""
    min_p: float = 0.0
    """Drop tokens whose probability is under ``min_p`` times the top token's."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already generated (OpenAI semantics)."""
    frequency_penalty: float = 0.0
    """Subtracted once per earlier occurrence in the output (OpenAI semantics)."""
    repetition_penalty: float = 1.0
    """Divides positive / multiplies negative logits of tokens in the prompt or output (>1 discourages)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias added to its logit) pairs, as OpenAI's ``logit_bias`` map."""
    logprobs: int | None = None
    """Report each chosen token's log-probability and that many alternatives (``None``: none)."""

    def __post_init__(self) -> None:
        # One stop string may be given bare, as in the OpenAI API; tuple("END") would be 3 stops.
        if not isinstance(self.stop, tuple):
            stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
            object.__setattr__(self, "stop", stop)
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.logit_bias, tuple):
            bias = tuple(sorted((int(k), float(v)) for k, v in dict(self.logit_bias).items()))
            object.__setattr__(self, "logit_bias", bias)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs!r}")

    @property
    def shapes_logits(self) -> bool:
        """Whether any option changes the logits before sampling (penalties, bias)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    def as_request(self) -> dict[str, Any]:
        """These parameters as fields of an OpenAI-compatible request body."""
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if self.ignore_eos:  # an SGLang/kvflow extension: sent only when asked for
            body["ignore_eos"] = True
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value != neutral:
                body[name] = value
        if self.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in self.logit_bias}
        if self.logprobs is not None:
            body["logprobs"] = True
            if self.logprobs:
                body["top_logprobs"] = self.logprobs
        return body

