"""The supervisor and swarm workflows: skewed seeded routing, a model's explicit choice wins, and
the DSL and LangGraph variants have the same graph and take the same route."""

from __future__ import annotations

from collections import Counter

import pytest

from kvflow_orch import END, START, BranchStats, run
from kvflow_orch.langgraph import compile_langgraph
from workflows._routing import draw, named_choice, zipf_weights
from workflows.supervisor import routing as supervisor_routing
from workflows.supervisor import supervisor, supervisor_app
from workflows.swarm import routing as swarm_routing
from workflows.swarm import swarm, swarm_app


def test_zipf_draws_follow_the_weights():
    weights = supervisor_routing(8, 1.2)["supervisor"]
    assert list(weights.values()) == pytest.approx(zipf_weights(8, 1.2))
    counts = Counter(draw(weights, 0, "task", i) for i in range(4000))
    for name, w in weights.items():
        assert counts[name] / 4000 == pytest.approx(w, abs=0.03)
    assert draw(weights, 1, "t", 3) == draw(weights, 1, "t", 3)


def test_swarm_matrix_is_skewed_and_seeded():
    matrix = swarm_routing(5, 1.2, seed=7)
    assert matrix == swarm_routing(5, 1.2, seed=7) and matrix != swarm_routing(5, 1.2, seed=8)
    for agent, row in matrix.items():
        assert agent not in row and sum(row.values()) == pytest.approx(1.0)
        assert max(row.values()) == pytest.approx(zipf_weights(4, 1.2)[0])


def test_a_named_choice_wins():
    assert named_choice("I think NEXT: worker_3 should act", ["worker_1", "worker_3"]) == "worker_3"
    assert named_choice("NEXT: nobody", ["worker_1"]) is None and named_choice("", ["a"]) is None


@pytest.mark.parametrize("bad", [{"workers": 0}, {"rounds": 0}])
def test_bad_supervisor_arguments(bad):
    with pytest.raises(ValueError):
        supervisor(**bad)


def test_graph_shapes():
    asg = supervisor(workers=3).compile()
    assert asg.plain_targets(START) == ("supervisor",)
    assert set(asg.branches_of("supervisor")[0].targets) == {"worker_0", "worker_1", "worker_2", END}
    assert all(asg.plain_targets(w) == ("supervisor",) for w in ("worker_0", "worker_1", "worker_2"))
    sw = swarm(agents=3).compile()
    assert sw.plain_targets(START) == ("agent_0",)
    assert set(sw.branches_of("agent_1")[0].targets) == {"agent_0", "agent_2", END}
    with pytest.raises(ValueError, match="at least 2"):
        swarm(agents=1)


def _fake_llm():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    return FakeListChatModel(responses=["noted"])


def _lg_route(app, inputs):
    return [name for step in app.stream(inputs, stream_mode="updates") for name in step]


def _targets(graph, node):
    return {t for b in graph.branches_of(node) for t in b.targets}


@pytest.mark.parametrize("kind", ["supervisor", "swarm"])
def test_dsl_and_langgraph_variants_agree(kind):
    if kind == "supervisor":
        shape = {"workers": 4, "rounds": 5, "fixed": 8, "dynamic": 2}
        wf, app = supervisor(**shape), supervisor_app(_fake_llm(), **shape)
    else:
        shape = {"agents": 4, "hops": 6, "fixed": 8, "dynamic": 2}
        wf, app = swarm(**shape), swarm_app(_fake_llm(), **shape)
    dsl, lg = wf.compile(), compile_langgraph(app)
    assert set(dsl.nodes) == set(lg.nodes)
    for node in (START, *dsl.nodes):
        assert _targets(dsl, node) == _targets(lg, node), node
    stats = BranchStats()
    result = run(wf, {"task": "t"}, backend="local:tiny-random", branch_stats=stats)
    assert [r.node for r in result.trace] == _lg_route(app, {"task": "t"})
    assert stats.decisions(kind, "supervisor" if kind == "supervisor" else "agent_0") >= 1
