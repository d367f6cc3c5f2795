"""Markov paging bounds (backends/sim/markov.py): Bélády beats every online policy on every
sequence, the MDP's best online policy is at least as good as the expected-steps rule and LRU in
the long run, first-passage times match closed forms, and bad chains are refused."""

from __future__ import annotations

import random

import pytest

from backends.sim.markov import (MarkovChain, _online_hits, belady_hits, best_online_policy, chain_of_routing,
                                 expected_steps_policy, hit_rates, lru_policy, mean_first_passage)
from workflows.swarm import routing


def random_chain(n: int, rng: random.Random) -> MarkovChain:
    rows = []
    for i in range(n):
        raw = [0.0 if j == i else rng.random() ** 3 for j in range(n)]
        rows.append(tuple(v / sum(raw) for v in raw))
    return MarkovChain(tuple(f"a{i}" for i in range(n)), tuple(rows))


def test_belady_by_hand():
    assert belady_hits([0, 1, 2, 0, 1, 2], 2) == 2
    assert belady_hits([0, 1, 0, 1], 2) == 2 and belady_hits([0, 0, 0], 1) == 2


def test_first_passage_closed_forms():
    flip = MarkovChain(("a", "b"), ((0.0, 1.0), (1.0, 0.0)))
    assert mean_first_passage(flip)[0][1] == pytest.approx(1.0)
    assert mean_first_passage(flip)[0][0] == pytest.approx(2.0)  # mean return time
    q = (0.5, 0.3, 0.2)  # independent draws: the wait for y is geometric, mean 1 / q[y]
    iid = MarkovChain(("a", "b", "c"), (q, q, q))
    m = mean_first_passage(iid)  # expected steps are rounded to 6 significant digits (the tie rule)
    assert m[0][1] == pytest.approx(1 / 0.3, rel=1e-5) and m[1][2] == pytest.approx(1 / 0.2, rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policies_are_ordered_as_the_theory_says(seed):
    rng = random.Random(seed)
    chain = random_chain(5, rng)
    for k in (2, 3):
        seqs = [chain.walk(20_000, random.Random(seed + 10 * k))]
        rates = hit_rates(chain, k, seqs)
        assert rates.belady >= max(rates.best_online, rates.expected_steps, rates.lru)
        assert rates.best_online >= max(rates.expected_steps, rates.lru) - 0.01  # optimal in expectation
        short = chain.walk(300, rng)
        best, steps = best_online_policy(chain, k), expected_steps_policy(chain)
        for policy in (best, steps, lru_policy):  # MIN is optimal on every single sequence
            assert belady_hits(short, k) >= _online_hits(short, k, policy)


def test_the_swarm_gap_to_belady_is_the_price_of_not_knowing_the_next_draw():
    chain = chain_of_routing(routing(6, 1.2, 0))
    rates = hit_rates(chain, 2, [chain.walk(50_000, random.Random(0))])
    assert rates.belady - rates.best_online > 0.05  # more than 5 points even for the best online policy
    assert rates.best_online - rates.expected_steps < 0.01  # and expected steps come within a point of it


def test_bad_chains_are_refused():
    with pytest.raises(ValueError, match="probability distribution"):
        MarkovChain(("a", "b"), ((0.5, 0.4), (1.0, 0.0)))
    with pytest.raises(ValueError, match=">= 2 agents"):
        MarkovChain(("a",), ((1.0,),))
    with pytest.raises(ValueError, match="k must be"):
        best_online_policy(MarkovChain(("a", "b"), ((0.0, 1.0), (1.0, 0.0))), 2)
    with pytest.raises(ValueError, match="no outgoing weight"):
        chain_of_routing({"a": {"b": 1.0}, "b": {}})
