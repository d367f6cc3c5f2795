"""Sampling parameters: the part of an LLM call both sides of the wire agree on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Sampling"]


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
        return body

