"""Choosing a solver, combining its scores with static steps, and the thin-statistics guard."""

from __future__ import annotations

import math
from typing import Hashable, Iterable, Mapping, Sequence, TypeVar

from ._chain import ChainSteps, can_end
from ._common import INF
from ._outcomes import OutcomeSteps

SIGNIFICANCE_Z = 2.5
"""How many standard deviations two targets' counts must differ by to be ranked apart."""
SETTLED = 10
"""Decisions per target after which a router's counts are used as they are (no pooling)."""

Outcome = Mapping[int, float]
K = TypeVar("K", bound=Hashable)


def pooled(probabilities: Mapping[K, float], counts: Mapping[K, float]) -> dict[K, float]:
    """The thin-statistics guard: ``probabilities`` (one router's, or one agent's successors')
    with the targets whose ``counts`` do not differ significantly pooled into groups that share
    their mean probability.

    Targets are ranked by count; each group starts at its most frequent target and takes every
    following target whose count is within ``SIGNIFICANCE_Z * sqrt(c_first + c_next)`` of the
    first's (under equal probabilities the difference of two Poisson counts has that standard
    deviation). A handful of decisions separates nothing, so a router starts uniform: its targets
    tie, and the brain keeps its LRU order among them, as with static steps. Once the router has
    made ``SETTLED`` decisions per target the counts are used as they are: differences still
    insignificant by then are small, and ranking by them beats recency (measured on the swarm and
    supervisor benchmarks, online and trained, over 16 to 24 seeds).
    """
    if sum(counts.values()) >= SETTLED * len(probabilities):
        return dict(probabilities)
    ranked = sorted(probabilities, key=lambda t: (-counts.get(t, 0.0), str(t)))
    out: dict[K, float] = {}
    i = 0
    while i < len(ranked):
        first = counts.get(ranked[i], 0.0)
        j = i + 1
        while j < len(ranked):
            c = counts.get(ranked[j], 0.0)
            if first - c > SIGNIFICANCE_Z * math.sqrt(first + c):
                break
            j += 1
        group = ranked[i:j]
        mean = sum(probabilities[t] for t in group) / len(group)
        out.update(dict.fromkeys(group, mean))
        i = j
    return {t: out[t] for t in probabilities}


def router_outcomes(row: Mapping[int, float]) -> list[dict[int, float]]:
    """A router's one outcome: ``row`` (target -> probability) scaled to sum to at most 1 (a
    fan-out router's inclusion probabilities may sum above it)."""
    total = sum(row.values())
    if total <= 0:
        return []
    scale = 1.0 / total if total > 1.0 else 1.0
    return [{w: p * scale for w, p in row.items() if p > 0}]


def _check(outcomes: Sequence[Sequence[Outcome]]) -> int:
    n = len(outcomes)
    for u, alternatives in enumerate(outcomes):
        for outcome in alternatives:
            for w, p in outcome.items():
                if not (0 <= w < n) or not (0 <= p <= 1):
                    raise ValueError(f"state {u}: bad transition {w!r} -> {p!r}")
            if sum(outcome.values()) > 1 + 1e-9:
                raise ValueError(f"state {u}: an outcome's probabilities sum above 1")
    return n


def solve(outcomes: Sequence[Sequence[Outcome]]) -> "ChainSteps | OutcomeSteps":
    """The solver for ``outcomes[u]`` (the outcomes of state ``u``): the closed form when the
    states form a chain that can end, policy iteration otherwise."""
    n = _check(outcomes)
    if all(len(alternatives) <= 1 for alternatives in outcomes):
        rows = [dict(alternatives[0]) if alternatives else {} for alternatives in outcomes]
        if can_end(rows):
            return ChainSteps(rows)
    return OutcomeSteps(outcomes, n)


def solve_ops(outcomes: Sequence[Sequence[Outcome]]) -> int:
    """About how many multiply-adds :func:`solve` spends (for callers that budget rebuilds)."""
    n = len(outcomes)
    chain = all(len(a) <= 1 for a in outcomes)
    return 2 * n ** 3 if chain else max(1, n ** 4 // 2)


def expected_steps(model: "ChainSteps | OutcomeSteps", active: Iterable[int],
                   static: Sequence[float] | None = None) -> list[float]:
    """Per state: 0 when active, else the smallest score over the active states, and with
    ``static`` its ``max`` with the static steps (kept where static is 0 or ``inf``)."""
    active = list(active)
    rows = [model.scores(a) for a in active]
    if not rows:
        best: Sequence[float] = [INF] * model.size
    else:
        best = rows[0] if len(rows) == 1 else list(map(min, *rows))  # one pass in C, not a min per state
    if static is None:
        out = list(best)
        for a in active:
            out[a] = 0
        return out
    return [b if 0 < s < b < INF else s for s, b in zip(static, best, strict=True)]
