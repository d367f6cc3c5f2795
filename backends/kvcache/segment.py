"""Prompt segmentation: where an agent's fixed prefix ends, in tokens.

An explicit boundary (the hint's ``fixed_prefix``, converted to tokens by the engine) wins. Without
one, the fixed prefix is the longest common token prefix of the agent's recent requests: the first
request of an agent is all dynamic (one request cannot tell fixed from dynamic).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from .bounded import Bound, BoundedLRU
from .hints import AgentRef

__all__ = ["Segmenter", "common_prefix_len"]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Segmenter:
    """Remembers the last ``history`` requests of each agent: at most ``max_agents`` agents and
    ``max_tokens`` tokens in all, the least recently seen agent forgotten first."""

    max_agents = Bound("_recent", "max_entries")
    max_tokens = Bound("_recent", "max_weight")

    def __init__(self, history: int = 2, max_agents: int = 65536, max_tokens: int = 1 << 22) -> None:
        if history < 2:
            raise ValueError(f"segmentation needs a history of at least 2 requests, got {history}")
        self.history = history
        self._recent: BoundedLRU[AgentRef, deque[tuple[int, ...]]] = BoundedLRU(
            max_agents, max_tokens, weigh=lambda recent: sum(len(t) for t in recent))

    def observe(self, ref: AgentRef, tokens: Sequence[int], explicit: int | None = None) -> int:
        """Record one request of ``ref`` and return its fixed-prefix length in tokens.

        ``explicit`` (clamped to ``len(tokens)``) is returned as is when given; it must be >= 0.
        """
        if explicit is not None and explicit < 0:
            raise ValueError(f"fixed_prefix_tokens must be >= 0, got {explicit}")
        tokens = tuple(tokens)
        recent = self._recent.pop(ref)
        if recent is None:
            recent = deque(maxlen=self.history)
        recent.append(tokens)
        self._recent.put(ref, recent)
        if explicit is not None:
            return min(explicit, len(tokens))
        if len(recent) < 2:
            return 0
        return min(common_prefix_len(tokens, other) for other in list(recent)[:-1])

    def forget(self, ref: AgentRef) -> None:
        self._recent.pop(ref)

    @property
    def token_count(self) -> int:
        return self._recent.weight
