"""Chains: every state has at most one outcome and can end; closed form in ``N = (I - P)^-1``."""

from __future__ import annotations

from operator import mul
from typing import Mapping, Sequence

from ._common import EPS, INF, round_steps, swap_in_pivot
from ._outcomes import OutcomeSteps

_MAX_INCREMENTAL = 32  # rank-one updates between full inversions (bounds the drift of N)


def can_end(rows: Sequence[Mapping[int, float]]) -> bool:
    """Whether every state reaches, with positive probability, one whose row sums below 1."""
    n = len(rows)
    preds: list[list[int]] = [[] for _ in range(n)]
    ends = []
    for u, row in enumerate(rows):
        if sum(row.values()) < 1 - 1e-9:
            ends.append(u)
        for w, p in row.items():
            if p > 0:
                preds[w].append(u)
    seen = set(ends)
    while ends:
        for u in preds[ends.pop()]:
            if u not in seen:
                seen.add(u)
                ends.append(u)
    return len(seen) == n


class ChainSteps:
    """A chain's expected steps from ``N = (I - P)^-1`` and ``N @ N`` (immutable: updates return a
    new object, so readers on other threads never see a half-updated matrix)."""

    __slots__ = ("size", "rows", "_n", "_m", "_scores", "_updates")

    def __init__(self, rows: Sequence[Mapping[int, float]], _state: tuple | None = None) -> None:
        self.size = len(rows)
        self.rows = tuple(dict(r) for r in rows)
        if _state is None:
            n_ = _inverse([[(1.0 if u == w else 0.0) - row.get(w, 0.0) for w in range(self.size)]
                           for u, row in enumerate(self.rows)])
            _state = (n_, _square(n_), 0)
        self._n, self._m, self._updates = _state
        self._scores: dict[int, list[float]] = {}

    def with_rows(self, changes: Mapping[int, Mapping[int, float]]) -> "ChainSteps":
        """This chain with some rows replaced: rank-one updates, or one inversion when that is
        cheaper or the updates since the last inversion reach a bound."""
        rows = list(self.rows)
        for u, row in changes.items():
            rows[u] = dict(row)
        if self._inverts(len(changes)) or not can_end(rows):
            return ChainSteps(rows) if can_end(rows) else OutcomeSteps([[r] if r else [] for r in rows])
        n_, m_ = self._n, self._m
        for u, row in changes.items():
            delta = {w: row.get(w, 0.0) - self.rows[u].get(w, 0.0) for w in {*row, *self.rows[u]}}
            updated = _sherman_morrison(n_, m_, u, delta)
            if updated is None:  # (I - P) near singular along the way: invert afresh
                return ChainSteps(rows)
            n_, m_ = updated
        return ChainSteps(rows, (n_, m_, self._updates + len(changes)))

    def _inverts(self, changed: int) -> bool:
        return changed * 5 >= self.size or self._updates + changed > _MAX_INCREMENTAL

    def update_ops(self, changed: int) -> int:
        """About how many multiply-adds :meth:`with_rows` spends on ``changed`` rows (a new
        inversion where it takes one)."""
        n = self.size
        return 2 * n ** 3 if self._inverts(changed) else 6 * n * n * changed

    def scores(self, a: int) -> list[float]:
        """Per target ``v``: the rounded score of ``v`` from ``a``'s firing (cached)."""
        row = self._scores.get(a)
        if row is None:
            n_, m_ = self._n, self._m
            na, ma = n_[a], m_[a]
            row = []
            for v in range(self.size):
                nvv = n_[v][v]
                hit = na[v] - (1.0 if a == v else 0.0)
                if hit <= EPS * nvv:
                    row.append(INF)
                    continue
                dav, dvv = ma[v] - na[v], m_[v][v] - nvv
                row.append(round_steps(max(1.0, (dav * nvv - hit * dvv) / (hit * hit))))
            self._scores[a] = row
        return row


def _inverse(a: list[list[float]]) -> list[list[float]]:
    """In-place Gauss-Jordan inversion with partial pivoting (``a`` is consumed)."""
    n = len(a)
    swaps = []
    for k in range(n):
        p = swap_in_pivot(a, k)
        if p != k:
            swaps.append((k, p))
        rk = a[k]
        inv = 1.0 / rk[k]
        rk[k] = 1.0
        rk = a[k] = [x * inv for x in rk]
        for i in range(n):
            ri = a[i]
            f = ri[k]
            if f and i != k:
                ri[k] = 0.0
                a[i] = [x - f * y for x, y in zip(ri, rk, strict=True)]
    for k, p in reversed(swaps):  # row swaps of the matrix are column swaps of its inverse
        for row in a:
            row[k], row[p] = row[p], row[k]
    return a


def _square(n_: list[list[float]]) -> list[list[float]]:
    cols = list(zip(*n_, strict=True))
    return [[sum(map(mul, row, col)) for col in cols] for row in n_]


def _sherman_morrison(n_, m_, u: int, delta: Mapping[int, float]):
    """``N`` and ``N @ N`` after row ``u`` of ``P`` changes by ``delta``: ``I - P`` loses
    ``e_u delta^T``, so ``N' = N + beta c w^T`` with ``c = N e_u``, ``w = delta^T N`` and
    ``beta = 1 / (1 - w_u)``; ``N'^2 = N^2 + beta ((N c + beta (w.c) c) w^T + c (w^T N)^T)``."""
    size = len(n_)
    w = [0.0] * size
    for t, d in delta.items():
        if d:
            w = [x + d * y for x, y in zip(w, n_[t], strict=True)]
    denom = 1.0 - w[u]
    if abs(denom) < 1e-9:
        return None
    beta = 1.0 / denom
    c = [row[u] for row in n_]
    nc = [sum(map(mul, row, c)) for row in n_]
    cols = list(zip(*n_, strict=True))
    wn = [sum(map(mul, w, col)) for col in cols]
    wc = sum(map(mul, w, c))
    left = [beta * (x + beta * wc * y) for x, y in zip(nc, c, strict=True)]  # (N c + beta (w.c) c) * beta
    bc = [beta * y for y in c]
    new_n = [[x + ci * wj for x, wj in zip(row, w, strict=True)] for row, ci in zip(n_, bc, strict=True)]
    new_m = [[x + li * wj + ci * vj for x, wj, vj in zip(row, w, wn, strict=True)]
             for row, li, ci in zip(m_, left, bc, strict=True)]
    return new_n, new_m
