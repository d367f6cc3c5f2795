"""Property tests: on random graphs and random valid executions, StepTracker agrees with an
independent model of the state (triggered set, running multiset, AND flags) and with a brute-force
Kleene iteration of the steps equations (kvflow_orch._steps) written here from the spec, not from kvflow's solver."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvflow_orch import END, START, Workflow

INF = math.inf


def route(state):
    return None


@st.composite
def graphs(draw):
    """Random workflows with cycles, AND-joins and conditional fan-out; every node reachable.

    Reachability is guaranteed by construction: node i gets a plain or conditional edge from START
    or from an earlier node. Extra edges may point anywhere (back edges make cycles).
    """
    n = draw(st.integers(1, 7))
    names = [f"n{i}" for i in range(n)]
    identities = {v: draw(st.sampled_from(["alpha", "beta", v])) for v in names}
    plain: set[tuple[str, str]] = set()
    branch_targets: dict[str, set[str]] = {}
    for i, v in enumerate(names):
        source = draw(st.sampled_from([START, *names[:i]]))
        if draw(st.booleans()):
            plain.add((source, v))
        else:
            branch_targets.setdefault(source, set()).add(v)
    sources = [START, *names]
    for _ in range(draw(st.integers(0, 2 * n))):
        u = draw(st.sampled_from(sources))
        v = draw(st.sampled_from([*names, END]))
        if draw(st.booleans()):
            plain.add((u, v))
        else:
            branch_targets.setdefault(u, set()).add(v)
    joins = []
    if n >= 2:
        for _ in range(draw(st.integers(0, 3))):
            members = draw(st.lists(st.sampled_from(names), min_size=2, max_size=3, unique=True))
            joins.append((tuple(members), draw(st.sampled_from([*names, END]))))
    return names, identities, sorted(plain), {k: sorted(v) for k, v in branch_targets.items()}, joins


def compile_graph(names, identities, plain, branches, joins):
    wf = Workflow("random")
    for v in names:
        wf.add_agent(v, system=f"system {identities[v]}", agent=identities[v])
    for u, v in plain:
        wf.add_edge(u, v)
    for u, targets in branches.items():
        wf.add_conditional_edges(u, route, targets)
    for members, v in joins:
        wf.add_edge(list(members), v)
    return wf.compile()


def reference_steps(names, plain, branches, joins, running, triggered, arrived):
    """Least fixed point by Kleene iteration from 0; a value above len(nodes) can only be inf."""
    groups: dict[str, list[list[str]]] = {v: [] for v in names}
    for u, v in plain:
        if v != END:
            groups[v].append([u])
    for u, targets in branches.items():
        for v in targets:
            if v != END:
                groups[v].append([u])
    for j, (members, v) in enumerate(joins):
        if v != END:
            groups[v].append([m for m in members if m not in arrived[j]])
    active = {v for v in names if running[v] or v in triggered}
    start_value = 0 if running[START] else INF
    cap = len(names) + 1
    value = {v: 0 for v in names}

    def of(u):
        return start_value if u == START else value[u]

    while True:
        new = {}
        for v in names:
            if v in active:
                new[v] = 0
                continue
            best = INF
            for group in groups[v]:
                cost = max((of(u) for u in group), default=INF)
                best = min(best, 1 + cost)
            new[v] = INF if best > cap else best
        if new == value:
            return value
        value = new


@settings(max_examples=150, deadline=None)
@given(graph=graphs(), data=st.data())
def test_tracker_matches_reference_over_random_executions(graph, data):
    names, identities, plain, branches, joins = graph
    asg = compile_graph(names, identities, plain, branches, joins)
    tracker = asg.tracker()

    # Independent model of the instance state.
    running: Counter[str] = Counter()
    triggered: set[str] = set()
    arrived: list[set[str]] = [set() for _ in joins]

    def fire(u, chosen):
        triggered.update(v for uu, v in plain if uu == u and v != END)
        triggered.update(v for v in chosen if v != END)
        for j, (members, v) in enumerate(joins):
            if u in members:
                arrived[j].add(u)
                if arrived[j] == set(members):
                    arrived[j].clear()
                    if v != END:
                        triggered.add(v)

    if branches.get(START):
        running[START] = 1
    else:
        fire(START, ())

    for _ in range(data.draw(st.integers(0, 25), label="moves")):
        expected = reference_steps(names, plain, branches, joins, running, triggered, arrived)
        assert tracker.steps() == expected
        agent_expected = {}
        for v in names:
            a = identities[v]
            agent_expected[a] = min(agent_expected.get(a, INF), expected[v])
        assert tracker.agent_steps() == agent_expected
        assert dict(tracker.running) == {k: c for k, c in running.items() if c}
        assert tracker.triggered == triggered
        assert tracker.done == (not +running and not triggered)

        moves = [("start", v) for v in sorted(triggered)] + [("finish", v) for v in sorted(+running)]
        if not moves:
            break
        kind, node = data.draw(st.sampled_from(moves), label="move")
        if kind == "start":
            tasks = data.draw(st.integers(1, 2), label="tasks")
            tracker.start(node, tasks=tasks)
            triggered.discard(node)
            running[node] += tasks
        else:
            declared = branches.get(node, [])
            chosen = data.draw(st.lists(st.sampled_from(declared), max_size=2), label="goto") if declared else []
            tracker.finish(node, goto=chosen)
            running[node] -= 1
            fire(node, chosen)


@settings(max_examples=100, deadline=None)
@given(graph=graphs())
def test_initial_steps_are_finite_exactly_for_compiled_graphs(graph):
    names, identities, plain, branches, joins = graph
    asg = compile_graph(names, identities, plain, branches, joins)
    running = Counter({START: 1} if branches.get(START) else {})
    triggered = set() if branches.get(START) else {v for u, v in plain if u == START and v != END}
    expected = reference_steps(names, plain, branches, joins, running, triggered, [set() for _ in joins])
    assert asg.tracker().steps() == expected
    assert all(s < INF for s in expected.values())
