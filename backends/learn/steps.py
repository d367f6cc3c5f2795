"""Expected steps-to-execution of a learned chain: the learner's one call into step math.

Semantics (learned routing's, issue 26): when agent ``a`` has just started, the steps of every other
agent ``v`` are ``E[T_v | v runs] / P(v runs)``, ``T_v`` the steps until ``v`` next starts (``a``'s
successors start at step 1), at least 1; ``inf`` where ``v`` cannot follow; 0 for ``a``; every value
rounded to 6 significant digits (the brain breaks equal steps by LRU, so float noise must not rank
agents apart).

This module is the learner's one seam to :mod:`kvflow_orch.stepmath`, which is that math (the chain
closed form, the tie rounding and the thin-statistics pooling, shared with learned routing). The
learner gives every agent's row ``alpha`` of end mass, so every agent can end the session and the
closed form applies.
"""

from __future__ import annotations

from typing import Mapping, Protocol

from kvflow_orch.stepmath import TransitionSteps

__all__ = ["StepsModel", "chain_from_counts"]


class StepsModel(Protocol):
    states: tuple[str, ...]

    def steps(self, current: str) -> dict[str, float]:
        """Expected steps of every state while ``current`` runs (``ValueError`` for an unknown one)."""


def chain_from_counts(counts: Mapping[str, Mapping[str, float]], ends: Mapping[str, float],
                      alpha: float) -> StepsModel:
    """The chain whose row ``s`` is ``(count(s -> t) + alpha) / (sum of s's counts + ends[s] + alpha *
    (successors + 1))``; ``ends`` must name every state of ``counts`` and ``alpha`` be > 0, so that
    every state can end."""
    return TransitionSteps.from_counts(counts, ends, alpha=alpha)
