"""instrument(app, branch_stats=...): routing decisions of conditional edges, Command(goto=...) and
Send are learned, and the hints of later runs carry the expected steps."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from lg_apps import chat_model

from kvflow_orch import BranchStats
from kvflow_orch.langgraph import handler_of, instrument
from workflows.supervisor import supervisor_app
from workflows.swarm import swarm_app


def _hints(server, wid):
    return [(h["agent"], h["steps"]) for h in server.hints() if h["workflow_id"] == wid]


def test_conditional_edges_are_learned_and_steer_the_hints(server, strict_tracking):
    stats = BranchStats()
    app = instrument(supervisor_app(chat_model(server.url), workers=3, rounds=60, fixed=8, dynamic=2),
                     backend_url=server.url, branch_stats=stats)
    app.invoke({"task": "t1"}, {"metadata": {"kvflow_workflow_id": "sup-1"}})
    assert stats.decisions("supervisor", "supervisor") == 61  # 60 workers, then END
    boss = [steps for agent, steps in _hints(server, "sup-1") if agent == "supervisor"]
    workers = [f"worker_{i}" for i in range(3)]
    # The first decisions are too few to rank the workers apart: static steps (every worker 1).
    assert boss[0] == {"supervisor": 0, **dict.fromkeys(workers, 1)}
    # Within the same run the tables follow the decisions: by the last turn the workers are ranked
    # by how often the supervisor chose them (the run never saw more than these 60 decisions).
    last = boss[-1]
    counts = stats.counts("supervisor", "supervisor")
    assert max(last[w] for w in workers) > 1.5 * min(last[w] for w in workers) > 1.5, last
    assert min(workers, key=lambda w: last[w]) == max(workers, key=lambda w: counts.get(w, 0))
    app.invoke({"task": "t2"}, {"metadata": {"kvflow_workflow_id": "sup-2"}})
    handler_of(app).backend.flush()
    assert stats.decisions("supervisor", "supervisor") == 122
    # run 2 starts from what run 1 learned
    first = _hints(server, "sup-2")[0][1]
    assert max(first[w] for w in workers) > 1.5 * min(first[w] for w in workers)


def test_command_goto_is_learned(server, strict_tracking):
    stats = BranchStats()
    app = instrument(swarm_app(chat_model(server.url), agents=3, hops=5, fixed=8, dynamic=2),
                     backend_url=server.url, branch_stats=stats)
    app.invoke({"task": "t"}, {"metadata": {"kvflow_workflow_id": "swarm-1"}})
    handler_of(app).backend.flush()
    observed = {router: stats.decisions("swarm", router) for _, router in stats.routers("swarm")}
    assert sum(observed.values()) == 5  # one hand-off (or END) per agent turn
    assert any(stats.probabilities("swarm", r).get("__end__") for r in observed)


class FanState(TypedDict, total=False):
    topic: str
    parts: Annotated[list, operator.add]


def test_send_targets_are_learned(server, strict_tracking):
    stats = BranchStats()
    llm = chat_model(server.url)

    def plan(state: FanState) -> dict:
        llm.invoke("plan")
        return {}

    def worker(state: FanState) -> dict:
        return {"parts": [state["topic"]]}

    g = StateGraph(FanState)
    g.add_node("plan", plan)
    g.add_node("worker", worker)
    g.add_node("other", worker)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", lambda s: [Send("worker", {"topic": "a"}), Send("worker", {"topic": "b"})],
                            ["worker", "other"])
    g.add_edge("worker", END)
    g.add_edge("other", END)
    app = instrument(g.compile(), backend_url=server.url, branch_stats=stats)
    result = app.invoke({"topic": "t"}, {"metadata": {"kvflow_workflow_id": "fan"}})
    handler_of(app).backend.flush()
    assert sorted(result["parts"]) == ["a", "b"]
    assert stats.decisions("LangGraph", "plan") == 1
    assert stats.to_json()["routers"][0]["counts"] == {"worker": 1.0}
