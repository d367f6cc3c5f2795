"""kvflow_orch.stepmath, the leaf every learner shares: the tie rule, the thin-statistics guard, the
chain and policy-iteration solvers against each other and against an independent value
iteration, rank-one updates, and the named-state API a server-side learner calls."""

from __future__ import annotations

import math
import random

import pytest

from test_expected_steps import supervisor  # the same supervisor graph

from kvflow_orch import END, BranchStats
from kvflow_orch.stepmath import (ChainSteps, OutcomeSteps, TransitionSteps, expected_steps, pooled, round_steps,
                                  solve)

INF = math.inf


# ------------------------------------------------------------------ ties
def test_the_issues_float_noise_rounds_to_one_value():
    # value iteration left the uniform workers of issue 26 at these two values
    assert round_steps(16.99999999994894) == round_steps(16.999999999948937) == 17.0
    assert round_steps(0) == 0 and round_steps(INF) == INF and round_steps(3) == 3.0
    assert round_steps(1 / 3) == 0.333333 and round_steps(123456789.0) == 123457000.0


def test_symmetric_states_tie_exactly_in_both_solvers():
    # a supervisor whose workers 1..3 are alike and 4..6 are alike: equal in exact arithmetic
    p = [0.2, 0.2, 0.2, 0.1, 0.1, 0.1]
    rows = [{w + 1: pw for w, pw in enumerate(p)}] + [{0: 1.0}] * 6
    for model in (ChainSteps(rows), OutcomeSteps([[r] for r in rows])):
        for a in range(7):
            s = model.scores(a)
            others = [v for v in (1, 2, 3) if v != a], [v for v in (4, 5, 6) if v != a]
            assert all(len({s[v] for v in group}) == 1 for group in others), (type(model).__name__, a, s)


# ------------------------------------------------------------------ thin statistics
def test_a_handful_of_decisions_pools_everything():
    probs = {"a": 0.4, "b": 0.2, "c": 0.2, END: 0.2}
    assert set(pooled(probs, {"a": 2, "b": 0, "c": 0}).values()) == {0.25}
    assert set(pooled(probs, {"a": 4}).values()) == {0.25}


def smoothed(counts):
    total = sum(counts.values()) + len(counts)
    return {t: (c + 1) / total for t, c in counts.items()}


def test_significant_counts_are_ranked_apart_and_insignificant_ones_pooled():
    counts = {"a": 20, "b": 6, "c": 2, "d": 1, END: 0}
    probs = smoothed(counts)
    out = pooled(probs, counts)
    assert out["a"] == probs["a"]  # 20 vs 6: more than 2.5 standard deviations apart
    rest = ["b", "c", "d", END]  # 6 vs 0..2: not yet
    assert len({out[t] for t in rest}) == 1 and out[END] == pytest.approx(sum(probs[t] for t in rest) / 4)
    assert sum(out.values()) == pytest.approx(1.0)


def test_settled_counts_are_used_as_they_are():
    counts = {"a": 60, "b": 25, "c": 10, "d": 8, END: 2}  # 10 decisions per target
    probs = smoothed(counts)
    assert pooled(probs, counts) == probs


# ------------------------------------------------------------------ solvers
def random_chain(rng: random.Random, n: int) -> list[dict[int, float]]:
    rows = []
    for _ in range(n):
        targets = rng.sample(range(n), rng.randint(1, min(4, n)))
        weights = [rng.random() + 0.05 for _ in targets]
        total = sum(weights) + rng.random() * 0.6 + 0.02  # some probability of ending
        rows.append({t: w / total for t, w in zip(targets, weights, strict=True)})
    return rows


@pytest.mark.parametrize("seed", range(10))
def test_chain_closed_form_equals_policy_iteration(seed):
    rng = random.Random(seed)
    rows = random_chain(rng, rng.randint(2, 12))
    chain, general = ChainSteps(rows), OutcomeSteps([[r] for r in rows])
    for a in range(len(rows)):
        assert chain.scores(a) == pytest.approx(general.scores(a), rel=2e-6)


@pytest.mark.parametrize("seed", range(6))
def test_rank_one_updates_equal_a_fresh_inversion(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 14)
    rows = random_chain(rng, n)
    chain = ChainSteps(rows)
    for _ in range(40):  # more than the bound between inversions
        u = rng.randrange(n)
        rows[u] = random_chain(rng, n)[0]
        chain = chain.with_rows({u: rows[u]})
    fresh = ChainSteps(rows)
    for a in range(n):
        assert chain.scores(a) == pytest.approx(fresh.scores(a), rel=2e-6)


def reference(alternatives, v, sweeps=20_000):
    """Value iteration of the most-urgent-outcome equations (the solver before issue 26)."""
    n = len(alternatives)
    h, g = [0.0] * n, [0.0] * n
    for _ in range(sweeps):
        change = 0.0
        for u in range(n):
            best, best_score = (0.0, 0.0), INF
            for o in alternatives[u]:
                oh = sum(p * (1.0 if w == v else h[w]) for w, p in o.items())
                og = sum(p * (1.0 if w == v else g[w] + h[w]) for w, p in o.items())
                if oh > 0 and og / oh ** 2 < best_score:
                    best, best_score = (oh, og), og / oh ** 2
            change = max(change, abs(best[0] - h[u]) + abs(best[1] - g[u]))
            h[u], g[u] = best
        if change < 1e-13:
            return h, g
    return None


@pytest.mark.parametrize("seed", range(40))
def test_policy_iteration_reaches_the_value_iteration_fixed_point(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 7)
    alternatives = []
    for _ in range(n):
        alts = [{w: 1.0} for w in rng.sample(range(n), rng.randint(0, 2))]  # plain edges (fan-out)
        if rng.random() < 0.6:
            alts.append(random_chain(rng, n)[0])
        alternatives.append(alts)
    model = OutcomeSteps(alternatives)
    for v in range(n):
        ref = reference(alternatives, v)
        if ref is None:
            continue  # most urgent outcomes need not settle (a fan-out cycle): no fixed point to match
        h, g = ref
        for a in range(n):
            want = round_steps(max(1.0, g[a] / h[a] ** 2)) if h[a] > 1e-12 else INF
            assert model.scores(a)[v] == pytest.approx(want, rel=1e-5), (seed, a, v)


def test_a_chain_that_cannot_end_is_solved_per_target():
    # a two-state ping-pong with a side state: every state recurs, nothing ends
    rows = [{1: 0.5, 2: 0.5}, {0: 1.0}, {0: 1.0}]
    model = solve([[r] for r in rows])
    assert isinstance(model, OutcomeSteps)
    # every state recurs surely: the scores are mean first-passage (return) times
    assert model.scores(0) == [2.0, 3.0, 3.0]  # 1 and 2: 1/2 at step 1, else two steps later, ...
    assert expected_steps(model, [1]) == [1.0, 0, 4.0]


def test_bad_outcomes_are_a_clear_error():
    with pytest.raises(ValueError, match="sum above 1"):
        solve([[{0: 0.7, 1: 0.7}], []])
    with pytest.raises(ValueError, match="bad transition"):
        solve([[{5: 0.5}]])


# ------------------------------------------------------------------ the learner's API
def test_a_learners_chain_gives_the_trackers_numbers():
    asg, names = supervisor(5)
    counts = {"w0": 50, "w1": 24, "w2": 12, "w3": 6, "w4": 3}
    stats = BranchStats()
    for target, n in (*counts.items(), (END, 5)):
        for _ in range(n):
            stats.observe("sup", "boss", target)
    # the same chain over agents, as a server-side learner would count it
    chain = TransitionSteps.from_counts({"boss": counts, **{w: {"boss": 100} for w in names}},
                                        ends={"boss": 5}, states=["boss", *names], alpha=1.0)
    tracker = asg.tracker(stats)
    tracker.start("boss")
    assert chain.steps("boss") == tracker.agent_steps()
    tracker.finish("boss", "w3")
    tracker.start("w3")
    assert chain.steps("w3") == tracker.agent_steps()
    assert chain.steps(["boss", "w3"])["w3"] == 0


def test_learner_updates_and_bad_states():
    chain = TransitionSteps({"a": {"b": 0.5, "c": 0.3}, "b": {"a": 0.9}, "c": {"a": 0.9}})
    updated = chain.with_row("b", {"a": 0.5, "c": 0.4})
    assert updated.steps("a") == TransitionSteps({"a": {"b": 0.5, "c": 0.3}, "b": {"a": 0.5, "c": 0.4},
                                                  "c": {"a": 0.9}}).steps("a")
    assert chain.steps("a")["a"] == 0 and chain.steps("a") != updated.steps("a")
    lonely = TransitionSteps({"a": {"b": 0.5}}, states=["a", "b", "z"])
    assert lonely.steps("a")["z"] == INF
    with pytest.raises(ValueError, match="unknown state"):
        chain.steps("nobody")
    with pytest.raises(ValueError, match="unknown states"):
        chain.with_row("a", {"nobody": 0.5})
