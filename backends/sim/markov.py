"""Markov paging: how close can any *online* eviction policy come to Bélády on routed workflows?

Model (the classic Markov paging setting): agents call one after another, the next agent drawn
from row ``x`` of a transition matrix ``P`` when agent ``x`` ran; the device pool holds the fixed
prefixes of ``k`` agents. A call whose agent is cached is a hit; otherwise its prefix is computed
and stays, and if that makes ``k + 1`` prefixes, one of the others is evicted (the running agent's
prefix cannot be). Policies compared on the same sequences:

* ``lru``: evict the least recently called agent (static kvflow ties fall back to it);
* ``expected steps``: evict the agent whose expected number of calls until it runs again (mean
  first-passage time from the current agent under ``P``) is largest, ties LRU: what
  ``kvflow-learned`` does with perfect statistics;
* ``best online``: the optimal policy of the average-cost Markov decision process whose state is
  (current agent, cached set) and whose action is the victim: no online policy that knows ``P``
  (let alone one that learns it) misses less in the long run;
* ``belady``: the offline optimum (evict the agent called again farthest in the future).

The gap between ``best online`` and ``belady`` is the price of not knowing the next draw: no
eviction rule removes it, so a target "within N points of Bélády" is infeasible where it exceeds N.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

__all__ = ["MarkovChain", "PagingRates", "mean_first_passage", "best_online_policy", "hit_rates",
           "belady_hits", "chain_of_routing"]


@dataclass(frozen=True)
class MarkovChain:
    """``names[i]`` calls ``names[j]`` next with probability ``p[i][j]``; ``start`` is the first caller."""

    names: tuple[str, ...]
    p: tuple[tuple[float, ...], ...]
    start: int = 0

    def __post_init__(self) -> None:
        n = len(self.names)
        if n < 2 or len(self.p) != n or any(len(row) != n for row in self.p):
            raise ValueError("a chain needs >= 2 agents and an n x n matrix")
        for i, row in enumerate(self.p):
            if any(v < 0 for v in row) or abs(sum(row) - 1) > 1e-9:
                raise ValueError(f"row {self.names[i]!r} is not a probability distribution")

    def walk(self, length: int, rng: random.Random) -> list[int]:
        seq, x, idx = [self.start], self.start, range(len(self.names))
        for _ in range(length - 1):
            x = rng.choices(idx, self.p[x])[0]
            seq.append(x)
        return seq


def chain_of_routing(routing: Mapping[str, Mapping[str, float]], names: Sequence[str] | None = None,
                     start: str | None = None) -> MarkovChain:
    """The chain of a swarm-style transition table (agent -> next agent -> weight)."""
    order = tuple(names or routing)
    rows = []
    for a in order:
        weights = routing.get(a, {})
        total = sum(weights.values())
        if total <= 0:
            raise ValueError(f"agent {a!r} has no outgoing weight")
        rows.append(tuple(weights.get(b, 0.0) / total for b in order))
    return MarkovChain(order, tuple(rows), order.index(start) if start else 0)


def mean_first_passage(chain: MarkovChain, iterations: int = 5000) -> list[list[float]]:
    """``m[x][y]``: expected calls from a call of ``x`` until the next call of ``y`` (``y != x``;
    ``m[x][x]`` is the mean return time). Value iteration on ``m[x][y] = 1 + sum_z p[x][z] m[z][y]``
    with ``m[y][y]`` treated as 0 inside the sum; ``inf`` where ``y`` is unreachable."""
    n = len(chain.names)
    out = [[0.0] * n for _ in range(n)]
    for y in range(n):
        h = [0.0] * n
        for _ in range(iterations):
            new = [1 + sum(chain.p[x][z] * (0.0 if z == y else h[z]) for z in range(n)) for x in range(n)]
            if max(abs(a - b) for a, b in zip(new, h, strict=True)) < 1e-12:
                h = new
                break
            h = new
        for x in range(n):
            out[x][y] = h[x] if h[x] < 1e9 else float("inf")
    return out


Policy = Callable[[int, frozenset, dict], int]
"""(agent being called, cached set without it, last call time per agent) -> victim."""


def best_online_policy(chain: MarkovChain, k: int, iterations: int = 20000) -> Policy:
    """The average-cost optimal victim choice for a pool of ``k`` prefixes (relative value
    iteration over states (current agent, cached set), damped so periodic chains converge)."""
    n = len(chain.names)
    if not 1 <= k < n:
        raise ValueError(f"k must be in 1..{n - 1}, got {k}")
    states = [(x, s) for s in map(frozenset, itertools.combinations(range(n), k)) for x in s]
    value = dict.fromkeys(states, 0.0)
    ref = states[0]

    def best_after_miss(z: int, cached: frozenset) -> tuple[float, int]:
        return min((value[(z, (cached - {v}) | {z})], v) for v in cached)

    for _ in range(iterations):
        new = {}
        for x, s in states:
            total = 0.0
            for z in range(n):
                pz = chain.p[x][z]
                if pz:
                    total += pz * (value[(z, s)] if z in s else 1 + best_after_miss(z, s)[0])
            new[(x, s)] = 0.5 * value[(x, s)] + 0.5 * total
        offset = new[ref]
        delta = max(abs(new[st] - offset - value[st]) for st in states)
        value = {st: v - offset for st, v in new.items()}
        if delta < 1e-10:
            break

    def policy(z: int, cached: frozenset, _last: dict) -> int:
        return best_after_miss(z, cached)[1]

    return policy


def expected_steps_policy(chain: MarkovChain) -> Policy:
    m = mean_first_passage(chain)
    return lambda z, cached, last: max(cached, key=lambda v: (m[z][v], -last.get(v, -1)))


def lru_policy(z: int, cached: frozenset, last: dict) -> int:
    return min(cached, key=lambda v: last.get(v, -1))


def _online_hits(seq: Sequence[int], k: int, policy: Policy) -> int:
    cached: set[int] = set()
    last: dict[int, int] = {}
    hits = 0
    for t, z in enumerate(seq):
        if z in cached:
            hits += 1
        else:
            if len(cached) >= k:
                cached.discard(policy(z, frozenset(cached), last))
            cached.add(z)
        last[z] = t
    return hits


def belady_hits(seq: Sequence[int], k: int) -> int:
    """Hits of the offline-optimal (MIN) policy on ``seq`` with ``k`` slots."""
    nxt = [0] * len(seq)
    upcoming: dict[int, int] = {}
    for t in range(len(seq) - 1, -1, -1):
        nxt[t] = upcoming.get(seq[t], len(seq) + t)
        upcoming[seq[t]] = t
    cached: dict[int, int] = {}  # agent -> time of its next call
    hits = 0
    for t, z in enumerate(seq):
        if z in cached:
            hits += 1
        elif len(cached) >= k:
            del cached[max(cached, key=lambda v: cached[v])]
        cached[z] = nxt[t]
    return hits


@dataclass(frozen=True)
class PagingRates:
    """Share of calls (after the first ``k`` distinct ones warm the pool) whose prefix is cached."""

    lru: float
    expected_steps: float
    best_online: float
    belady: float
    calls: int


def hit_rates(chain: MarkovChain, k: int, sequences: Sequence[Sequence[int]]) -> PagingRates:
    """Each policy's hit share over ``sequences`` (every policy sees the same calls)."""
    best = best_online_policy(chain, k)
    steps = expected_steps_policy(chain)
    totals = [0, 0, 0, 0]
    calls = 0
    for seq in sequences:
        calls += len(seq)
        totals[0] += _online_hits(seq, k, lru_policy)
        totals[1] += _online_hits(seq, k, steps)
        totals[2] += _online_hits(seq, k, best)
        totals[3] += belady_hits(seq, k)
    return PagingRates(*(t / calls for t in totals), calls=calls)
