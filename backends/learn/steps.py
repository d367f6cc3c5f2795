"""Expected steps-to-execution of a learned chain: the learner's one call into step math.

Semantics (learned routing's, issue 26): when agent ``a`` has just started, the steps of every other
agent ``v`` are ``E[T_v | v runs] / P(v runs)``, ``T_v`` the steps until ``v`` next starts (``a``'s
successors start at step 1), at least 1; ``inf`` where ``v`` cannot follow; 0 for ``a``; every value
rounded to 6 significant digits (the brain breaks equal steps by LRU, so float noise must not rank
agents apart).

This module is the seam to ``kvflow_orch.stepmath`` (branch i26-routing), which is that math: at the
merge, :func:`chain_from_counts` becomes ``return TransitionSteps.from_counts(counts, ends,
alpha=alpha)`` (adding stepmath's thin-statistics pooling) and :class:`_Chain` goes. Until then
:class:`_Chain` is the minimal closed form for a chain in which every agent can end the session,
which the learner guarantees: every agent's row carries ``alpha`` of end mass. With ``N = (I - P)^-1``
and ``D = N N - N``, ``hit = N_av - [a = v]``: ``score_v(a) = (D_av N_vv - hit D_vv) / hit**2``.
"""

from __future__ import annotations

import math
from operator import mul
from typing import Mapping, Protocol

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
    return _Chain(counts, ends, alpha)


class _Chain:
    __slots__ = ("states", "_index", "_n", "_cols", "_m_diag", "_cache")

    def __init__(self, counts: Mapping[str, Mapping[str, float]], ends: Mapping[str, float], alpha: float) -> None:
        names = dict.fromkeys(counts)
        for row in counts.values():
            names.update(dict.fromkeys(row))
        self.states = tuple(names)
        self._index = {s: i for i, s in enumerate(self.states)}
        size = len(self.states)
        a = [[float(i == j) for j in range(size)] for i in range(size)]  # I - P
        for s, row in counts.items():
            total = sum(row.values()) + ends[s] + alpha * (len(row) + 1)
            u = self._index[s]
            for t, c in row.items():
                a[u][self._index[t]] -= (c + alpha) / total
        self._n = _inverse(a)
        self._cols = list(zip(*self._n))
        self._m_diag = [_dot(r, c) for r, c in zip(self._n, self._cols)]  # (N N)_vv; rows of N N on demand
        self._cache: dict[str, dict[str, float]] = {}

    def steps(self, current: str) -> dict[str, float]:
        if current not in self._index:
            raise ValueError(f"unknown state {current!r}")
        out = self._cache.get(current)
        if out is None:
            a = self._index[current]
            na = self._n[a]
            ma = [_dot(na, c) for c in self._cols]
            out = {}
            for v, name in enumerate(self.states):
                nvv = self._n[v][v]
                hit = na[v] - (1.0 if a == v else 0.0)
                if v == a:
                    out[name] = 0.0
                elif hit <= 1e-12 * nvv:
                    out[name] = math.inf
                else:
                    dav, dvv = ma[v] - na[v], self._m_diag[v] - nvv
                    out[name] = _round(max(1.0, (dav * nvv - hit * dvv) / (hit * hit)))
            self._cache[current] = out
        return dict(out)


def _dot(x, y) -> float:
    return sum(map(mul, x, y))


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def _inverse(a: list[list[float]]) -> list[list[float]]:
    """Gauss-Jordan on ``[a | I]`` with partial pivoting (``I - P`` of a chain that can end is invertible)."""
    size = len(a)
    rows = [r + [float(i == j) for j in range(size)] for i, r in enumerate(a)]
    for k in range(size):
        p = max(range(k, size), key=lambda i: abs(rows[i][k]))
        rows[k], rows[p] = rows[p], rows[k]
        pivot = rows[k]
        inv = 1.0 / pivot[k]
        pivot = rows[k] = [x * inv for x in pivot]
        for i in range(size):
            f = rows[i][k]
            if f and i != k:
                rows[i] = [x - f * y for x, y in zip(rows[i], pivot)]
    return [r[size:] for r in rows]
