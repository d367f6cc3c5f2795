"""States with several outcomes (or a chain that cannot end): policy iteration per target."""

from __future__ import annotations

from operator import mul
from typing import Mapping, Sequence

from ._common import EPS, INF, round_steps, swap_in_pivot

_MAX_POLICY_ROUNDS = 64
Outcome = Mapping[int, float]


class OutcomeSteps:
    """Expected steps where states may have several outcomes: policy iteration per target."""

    __slots__ = ("size", "_tables", "_scores")

    def __init__(self, outcomes: Sequence[Sequence[Outcome]], size: int | None = None) -> None:
        self.size = len(outcomes) if size is None else size
        alternatives = [[dict(o) for o in alts if o] for alts in outcomes]
        self._tables = [_solve_target(alternatives, v) for v in range(self.size)]  # [v] -> (h, g)
        self._scores: dict[int, list[float]] = {}

    def scores(self, a: int) -> list[float]:
        row = self._scores.get(a)
        if row is None:
            row = []
            for h, g in self._tables:
                ha = h[a]
                row.append(round_steps(max(1.0, g[a] / (ha * ha))) if ha > EPS else INF)
            self._scores[a] = row
        return row


def _outcome_value(outcome: Mapping[int, float], v: int, h: list[float], g: list[float]) -> tuple[float, float]:
    oh = og = 0.0
    for w, p in outcome.items():
        if w == v:
            oh += p
            og += p
        else:
            oh += p * h[w]
            og += p * (g[w] + h[w])
    return oh, og


def _score(oh: float, og: float) -> float:
    return og / (oh * oh) if oh > EPS else INF


def _solve_target(alternatives: list[list[dict[int, float]]], v: int) -> tuple[list[float], list[float]]:
    """``(h_v, g_v)`` over every state: policy iteration from the policy that is nearest in hops."""
    n = len(alternatives)
    hops = _hops_to(alternatives, v)
    policy = []
    for alts in alternatives:
        ranked = [min((0 if w == v else 1 + hops[w]) for w in o) for o in alts]
        policy.append(ranked.index(min(ranked)) if alts else -1)
    h = g = [0.0] * n
    tried = set()
    for _ in range(_MAX_POLICY_ROUNDS):
        h, g = _evaluate(alternatives, policy, v)
        tried.add(tuple(policy))
        changed = False
        for u, alts in enumerate(alternatives):
            if len(alts) < 2:
                continue
            current = _score(*_outcome_value(alts[policy[u]], v, h, g))
            for i, o in enumerate(alts):
                s = _score(*_outcome_value(o, v, h, g))
                if s < current * (1 - 1e-9):
                    policy[u], current, changed = i, s, True
        if not changed or tuple(policy) in tried:  # stable, or a cycle (most urgent outcomes need not settle)
            break
    return h, g


def _hops_to(alternatives: list[list[dict[int, float]]], v: int) -> list[float]:
    """Fewest firings from each state's firing until ``v`` starts, over every outcome (BFS)."""
    n = len(alternatives)
    preds: list[set[int]] = [set() for _ in range(n)]
    for u, alts in enumerate(alternatives):
        for o in alts:
            for w in o:
                preds[w].add(u)
    hops = [INF] * n
    frontier, level = [v], 0
    seen = {v}
    while frontier:
        nxt = []
        for w in frontier:
            for u in preds[w]:
                if hops[u] == INF:
                    hops[u] = level
                if u not in seen:
                    seen.add(u)
                    nxt.append(u)
        frontier, level = nxt, level + 1
    return hops


def _evaluate(alternatives, policy: list[int], v: int) -> tuple[list[float], list[float]]:
    """Solve ``(I - A) h = c`` and ``(I - A) g = h`` over the states that reach ``v`` under ``policy``."""
    n = len(alternatives)
    chosen = [alternatives[u][policy[u]] if policy[u] >= 0 else {} for u in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, o in enumerate(chosen):
        for w, p in o.items():
            if p > 0:
                preds[w].append(u)
    reach, stack = [], [v]
    seen = set()
    while stack:  # states from which v can start: predecessors of v, transitively
        for u in preds[stack.pop()]:
            if u not in seen:
                seen.add(u)
                reach.append(u)
                stack.append(u)
    h, g = [0.0] * n, [0.0] * n
    if not reach:
        return h, g
    at = {u: i for i, u in enumerate(reach)}
    k = len(reach)
    matrix = []
    c = []
    for u in reach:
        row = [0.0] * k
        row[at[u]] = 1.0
        for w, p in chosen[u].items():
            if w != v and w in at:
                row[at[w]] -= p
        matrix.append(row)
        c.append(chosen[u].get(v, 0.0))
    lu, perm = _lu(matrix)
    hr = _lu_solve(lu, perm, c)
    gr = _lu_solve(lu, perm, hr)
    for u, i in at.items():
        h[u] = min(1.0, max(0.0, hr[i]))
        g[u] = max(0.0, gr[i])
    return h, g


def _lu(a: list[list[float]]) -> tuple[list[list[float]], list[int]]:
    n = len(a)
    perm = list(range(n))
    for k in range(n):
        p = swap_in_pivot(a, k)
        if p != k:
            perm[k], perm[p] = perm[p], perm[k]
        rk, pivot = a[k], a[k][k]
        for i in range(k + 1, n):
            f = a[i][k] / pivot
            if f:
                ri = a[i]
                ri[k] = f
                ri[k + 1:] = [x - f * y for x, y in zip(ri[k + 1:], rk[k + 1:], strict=True)]
            else:
                a[i][k] = 0.0
    return a, perm


def _lu_solve(lu: list[list[float]], perm: list[int], b: list[float]) -> list[float]:
    n = len(lu)
    y = [b[p] for p in perm]
    for i in range(n):
        y[i] -= sum(map(mul, lu[i][:i], y[:i]))
    for i in range(n - 1, -1, -1):
        y[i] = (y[i] - sum(map(mul, lu[i][i + 1:], y[i + 1:]))) / lu[i][i]
    return y
