"""Expected steps (kvflow_orch._expected): static semantics without stats, static values on
deterministic graphs, an independent Monte-Carlo estimate on random routed graphs, tables that
follow the statistics while a workflow runs, equal steps for equal probabilities, thin statistics
kept static, and refreshes bounded by decisions and work."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from kvflow_orch import END, START, BranchStats, Workflow
from kvflow_orch.stepmath import pooled

INF = math.inf


def route(state):
    return END


def supervisor(workers=4):
    wf = Workflow("sup")
    wf.add_agent("boss", system="boss")
    names = [f"w{i}" for i in range(workers)]
    for w in names:
        wf.add_agent(w, system=w)
        wf.add_edge(w, "boss")
    wf.add_edge(START, "boss")
    wf.add_conditional_edges("boss", route, names + [END])
    return wf.compile(), names


def test_without_stats_steps_are_static():
    asg, names = supervisor()
    tracker = asg.tracker()
    tracker.start("boss")
    assert tracker.steps() == {"boss": 0, **{w: 1 for w in names}}


def test_learned_skew_orders_the_workers():
    asg, names = supervisor()
    stats = BranchStats()
    for target, n in (("w0", 60), ("w1", 25), ("w2", 10), ("w3", 1), (END, 4)):
        for _ in range(n):
            stats.observe("sup", "boss", target)
    tracker = asg.tracker(stats)
    tracker.start("boss")
    steps = tracker.steps()
    assert steps["boss"] == 0
    assert 1 < steps["w0"] < steps["w1"] < steps["w2"] < steps["w3"] < INF
    tracker.finish("boss", "w2")
    tracker.start("w2")
    after = tracker.steps()
    assert after["w2"] == 0 and after["boss"] == 1
    # one more hop (through boss first): E[T | runs] grows by 1, P(runs) is the same
    for w in ("w0", "w1", "w3"):
        assert after[w] > steps[w]
    assert after["w0"] < after["w1"] < after["w3"]
    tracker.finish("w2")
    tracker.start("boss")
    tracker.finish("boss", END)
    assert tracker.done and set(tracker.steps().values()) == {INF}


def test_deterministic_parts_equal_static_values():
    wf = Workflow("det")
    for n in "abcdefg":
        wf.add_agent(n, system=n)
    wf.add_edge(START, "a")
    wf.add_edge("a", "b")
    wf.add_edge("a", "c")
    wf.add_edge(["b", "c"], "d")  # AND-join
    wf.add_edge("c", "e")
    wf.add_edge("e", "f")
    wf.add_edge(["d", "f"], "g")
    wf.add_conditional_edges("g", route, ["a", END])
    asg = wf.compile()
    stats = BranchStats()
    for t in ["a"] * 3 + [END] * 30:  # significant: the router mostly ends
        stats.observe("det", "g", t)
    static, learned = asg.tracker(), asg.tracker(stats)
    assert learned.steps() == static.steps()  # a is triggered: the whole pass is deterministic
    pending = set("bcdefg")
    for node in ("a", "c", "b", "e", "d", "f"):
        for tr in (static, learned):
            tr.start(node)
            tr.finish(node)
        pending.discard(node)
        # the rest of this pass is deterministic; what already ran comes back only through g's router
        assert {n: learned.steps()[n] for n in pending} == {n: static.steps()[n] for n in pending}
        assert all(learned.steps()[n] > static.steps()[n] for n in set("abcdef") - pending)


# ------------------------------------------------------------------ Monte-Carlo
def random_graph(seed: int):
    """A random single-token graph: every node fires one successor (a plain edge or one choice of
    its conditional edges), loops included; END probabilities keep runs finite."""
    rng = random.Random(seed)
    n = rng.randint(3, 7)
    names = [f"n{i}" for i in range(n)]
    succ: dict[str, list[str]] = {name: [] for name in names}
    for i in range(1, n):
        succ[names[rng.randrange(i)]].append(names[i])  # a spanning tree: all reachable
    wf = Workflow(f"g{seed}")
    for name in names:
        wf.add_agent(name, system=name)
    wf.add_edge(START, names[0])
    routers = {}
    for name in names:
        targets = succ[name] + rng.sample(names, rng.randint(0, 2))
        targets = list(dict.fromkeys(targets))
        if len(targets) == 1 and rng.random() < 0.5:
            wf.add_edge(name, targets[0])
            continue
        targets.append(END)
        wf.add_conditional_edges(name, route, targets)
        routers[name] = targets
    stats = BranchStats()
    for name, targets in routers.items():
        weights = [rng.random() ** 2 + 0.05 for _ in targets]
        for _ in range(30):
            stats.observe(wf.name, name, rng.choices(targets, weights)[0])
    return wf.compile(), stats, routers


def monte_carlo(asg, probs, plain, start: str, rng, samples: int, horizon: int = 400):
    """P(v starts again) and E[steps | it does], by walking the token from ``start``'s firing."""
    hits: dict[str, int] = {}
    total: dict[str, int] = {}
    for _ in range(samples):
        seen: set[str] = set()
        node, step = start, 0
        while step < horizon:
            if node in probs:
                targets = list(probs[node])
                node = rng.choices(targets, [probs[node][t] for t in targets])[0]
            else:
                node = plain[node]
            step += 1
            if node == END:
                break
            if node not in seen:
                seen.add(node)
                hits[node] = hits.get(node, 0) + 1
                total[node] = total.get(node, 0) + step
    return {v: (hits[v] / samples, total[v] / hits[v]) for v in hits}


@pytest.mark.parametrize("seed", range(8))
def test_expected_steps_match_monte_carlo(seed):
    asg, stats, routers = random_graph(seed)
    # the probabilities the tables use: learned ones, pooled where the counts are too thin to rank apart
    probs = {r: pooled(p, stats.counts(asg.name, r)) for r, p in asg.routing_probabilities(stats).items()}
    plain = {n: asg.plain_targets(n)[0] for n in asg.nodes if n not in routers}
    rng = random.Random(1000 + seed)
    tracker = asg.tracker(stats)
    node = asg.plain_targets(START)[0]
    for _ in range(rng.randint(0, 4)):  # walk a few steps into the run
        tracker.start(node)
        goto = None
        if node in probs:
            targets = [t for t in probs[node] if t != END] or list(probs[node])
            goto = rng.choice(targets)
        else:
            goto = None
        tracker.finish(node, goto)
        nxt = goto if goto is not None else plain[node]
        if nxt == END:
            break
        node = nxt
    if tracker.done:
        return
    tracker.start(node)
    steps = tracker.steps()
    estimate = monte_carlo(asg, probs, plain, node, rng, samples=20_000)
    for v, value in steps.items():
        if v == node:
            assert value == 0
            continue
        if v not in estimate:
            assert value == INF or value > 50  # practically never: the walk did not see it
            continue
        p, mean = estimate[v]
        hits = p * 20_000  # the estimate of a rare target is noisier: 4 standard errors of its hit count
        assert value == pytest.approx(mean / p, rel=max(0.06, 4 / math.sqrt(hits))), (v, p, mean)


# ------------------------------------------------------------------ issue 26
SKEW = {"w0": 0.5, "w1": 0.25, "w2": 0.12, "w3": 0.07, "w4": 0.04, "w5": 0.02}


def test_tables_follow_the_statistics_during_a_run():
    # one long supervisor loop from empty statistics: the decisions it makes reach its own hints
    asg, names = supervisor(6)
    stats = BranchStats()
    tracker = asg.tracker(stats)
    rng = random.Random(7)
    for _ in range(60):
        tracker.start("boss")
        worker = rng.choices(names, [SKEW[w] for w in names])[0]
        stats.observe("sup", "boss", worker)
        tracker.finish("boss", worker)
        tracker.start(worker)
        tracker.finish(worker)
    tracker.start("boss")
    steps = tracker.agent_steps()
    probs = stats.probabilities("sup", "boss", [*names, END])
    assert probs["w0"] > 3 * probs["w4"]
    assert steps["w4"] > 2 * steps["w0"] > 2, steps  # not the uniform values it started with


def test_equal_probabilities_give_equal_steps():
    # w0..w2 alike and w3..w5 alike: equal in exact arithmetic, so equal floats (not float noise)
    asg, names = supervisor(6)
    stats = BranchStats()
    for target, n in (("w0", 20), ("w1", 20), ("w2", 20), ("w3", 3), ("w4", 3), ("w5", 3), (END, 2)):
        for _ in range(n):
            stats.observe("sup", "boss", target)
    tracker = asg.tracker(stats)
    for node in ("boss", "w4"):
        tracker.start(node)
        steps = tracker.agent_steps()
        assert len({steps[w] for w in ("w0", "w1", "w2")}) == 1, steps
        assert len({steps[w] for w in ("w3", "w5")}) == 1, steps
        assert steps["w0"] < steps["w3"]
        tracker.finish(node, "w4" if node == "boss" else None)


def test_thin_statistics_keep_the_static_steps():
    asg, names = supervisor(6)
    stats = BranchStats()
    for target in ("w5", "w5", "w3", "w5"):  # a handful of decisions, all for rare workers
        stats.observe("sup", "boss", target)
    learned, static = asg.tracker(stats), asg.tracker()
    for tr in (learned, static):
        tr.start("boss")
    assert learned.agent_steps() == static.agent_steps()
    assert asg.expected_tables(stats).current() is None  # nothing solved: no router learned anything


def test_trackers_of_a_graph_share_one_table_per_statistics():
    asg, _ = supervisor(3)
    stats, other = BranchStats(), BranchStats()
    assert asg.expected_tables(stats) is asg.expected_tables(stats)
    assert asg.expected_tables(stats) is not asg.expected_tables(other)


def loop_graph(n: int):
    """The orchestration-overhead benchmark's shape: n stages in a loop, the last one routes."""
    wf = Workflow("loop100")
    names = [f"s{i:02d}" for i in range(n)]
    for name in names:
        wf.add_agent(name, system=name)
    wf.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        wf.add_edge(a, b)
    wf.add_conditional_edges(names[-1], route, [names[0], names[n // 2], END])
    return wf.compile(), names


def test_refreshes_are_bounded_by_decisions_and_work():
    from kvflow_orch._expected import BUDGET_OPS

    asg, names = loop_graph(100)
    stats = BranchStats()
    tracker = asg.tracker(stats)
    tables = asg.expected_tables(stats)
    transitions = decisions = 0
    rng = random.Random(3)
    node = names[0]
    while decisions < 400:
        tracker.start(node)
        goto = None
        if node == names[-1]:
            goto = rng.choices([names[0], names[50], END], [0.7, 0.25, 0.05])[0]
            stats.observe(asg.name, node, goto)
            decisions += 1
        tracker.finish(node, goto)
        tracker.agent_steps()
        transitions += 2
        node = names[(names.index(node) + 1) % 100] if goto is None else (names[0] if goto == END else goto)
        if goto == END:
            tracker = asg.tracker(stats)
    assert tables.current() is not None  # the router learned something
    # a full solve costs 2 * 101**3 multiply-adds, an update 6 * 101**2 (or a new inversion every
    # 32 updates): the work stays within the budget per transition, plus the credit a graph starts with
    spent = tables.solves * 2 * 101 ** 3 + tables.updates * 6 * 101 ** 2 + (tables.updates // 32) * 2 * 101 ** 3
    assert spent <= BUDGET_OPS * (transitions + 4)
    # ... and far fewer refreshes than decisions once the probabilities settle
    assert tables.solves + tables.updates < decisions / 4


def test_tables_go_with_their_statistics():
    import gc

    asg, _ = supervisor(3)
    stats = BranchStats()
    asg.tracker(stats).steps()
    assert len(asg._expected) == 1
    del stats
    gc.collect()
    assert len(asg._expected) == 0  # no statistics object outlives its last user through the graph
