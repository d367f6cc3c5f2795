"""Expected steps-to-execution under learned branch probabilities.

The static solver (:mod:`kvflow_orch._steps`) answers the *earliest* step a node can run. With
routing probabilities ``p_r(t)`` (the chance that a decision of router ``r`` includes ``t``) this
module answers how far a node is *expected* to be. For a target ``v`` let ``T_v`` be the number of
steps until ``v`` next starts (``inf`` if it never does); we report::

    expected(v) = E[T_v | v runs again] / P(v runs again)

the expected steps until ``v`` runs if the workflow were retried from the current state until it
does, each attempt counted at the mean length of a successful one (a geometric number ``1/P`` of
attempts). It is ``inf`` when ``v`` cannot run, equals ``E[T_v]`` when ``v`` surely runs, and grows
as ``v`` becomes unlikely, which is the order eviction and prefetch need.

Equations (an absorbing Markov chain over "``u`` fires", solved per target by value iteration).
For target ``v`` and node ``u`` let ``h_v(u) = P(v starts after u fires)`` and
``g_v(u) = E[T_v ; v starts]`` counted from ``u``'s firing (its successors start at step 1). A
successor ``w`` starting at step 1 offers::

    succ_v(w) = (1, 1)                                  if w == v
              = (h_v(w), g_v(w) + h_v(w))               otherwise (w runs, then fires)

and ``u``'s firing combines its outcomes::

    plain edge / AND-join membership u -> w:  succ_v(w)                      (always fires)
    conditional edges of u:                   sum over targets t of p_u(t) * succ_v(t)
                                              (END contributes nothing; h capped at 1)
    (h_v(u), g_v(u)) = the outcome with the smallest g / h**2                 (min, as static)

For one token moving through the graph (every firing picks exactly one successor) this is exact.
Concurrent branches (fan-out, several routers) take the most urgent outcome, as the static solver's
``min``; AND-joins are counted as plain edges in the chain and get their ``max`` back below.

In a run-time state with active (running or triggered) nodes ``A`` and static steps ``s``::

    steps(v) = 0                                          if v in A
             = inf                                        if s(v) = inf (cannot run again)
             = max(s(v), min over a in A of g_v(a) / h_v(a)**2)

The ``max`` with the static value keeps AND-join waits (a join target cannot run before its last
member) and makes deterministic parts equal the static values: with every probability 0 or 1,
``g / h**2`` is a shortest distance, never above ``s(v)``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

__all__ = ["ExpectedTables", "build_tables", "expected_steps"]

INF = math.inf
_TOL = 1e-12
_MAX_SWEEPS = 20_000

# tables[v][u] = (h, g): target v, firing node u
ExpectedTables = list[list[tuple[float, float]]]


def build_tables(
    size: int,
    always: Sequence[Sequence[int]],
    routed: Sequence[Mapping[int, float]],
) -> ExpectedTables:
    """``always[u]``: successors that fire whenever ``u`` fires (plain edges, join targets);
    ``routed[u]``: conditional target -> probability (END left out)."""
    tables: ExpectedTables = []
    for v in range(size):
        h = [0.0] * size
        g = [0.0] * size
        for _ in range(_MAX_SWEEPS):
            change = 0.0
            for u in range(size):
                best_h, best_g = _fire(v, always[u], routed[u], h, g)
                delta = abs(best_h - h[u]) + abs(best_g - g[u])
                if delta > change:
                    change = delta
                h[u], g[u] = best_h, best_g
            if change <= _TOL * (1 + max(g)):
                break
        tables.append(list(zip(h, g, strict=True)))
    return tables


def _fire(v: int, always: Sequence[int], routed: Mapping[int, float], h: list[float],
          g: list[float]) -> tuple[float, float]:
    best = (0.0, 0.0)
    best_score = INF
    for w in always:
        cand = (1.0, 1.0) if w == v else (h[w], g[w] + h[w])
        if cand[0] > 0 and _score(*cand) < best_score:
            best, best_score = cand, _score(*cand)
    if routed:
        mh = mg = 0.0
        for w, p in routed.items():
            if w == v:
                mh += p
                mg += p
            else:
                mh += p * h[w]
                mg += p * (g[w] + h[w])
        if mh > 1.0:  # inclusion probabilities of a fan-out router may sum above 1
            mg /= mh
            mh = 1.0
        if mh > 0 and _score(mh, mg) < best_score:
            best = (mh, mg)
    return best


def _score(h: float, g: float) -> float:
    """``E[T | hit] / P(hit)`` from ``h = P(hit)`` and ``g = E[T ; hit]``."""
    return g / (h * h)


def expected_steps(tables: ExpectedTables, active: Sequence[int], static: list[float]) -> list[float]:
    """Per node: the run-time steps of the module docstring from the static solution ``static``."""
    out = list(static)
    for v, row in enumerate(tables):
        s = static[v]
        if s == 0 or s == INF:
            continue
        best = INF
        for a in active:
            hv, gv = row[a]
            if hv > 0:
                score = _score(hv, gv)
                if score < best:
                    best = score
        if best != INF and best > s:
            out[v] = best
    return out
