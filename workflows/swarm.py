"""A swarm: agents hand the conversation off to each other until one ends it.

START -> agent_0; each agent hands off to another agent (or ends once ``hops`` agents have run).
The hand-off is what a model choosing a transfer tool would produce: the agent its reply names as
``NEXT: <agent>``, or else a draw from row ``i`` of a seeded transition matrix (:func:`routing`:
every row puts Zipf(``zipf_s``) weights on the other agents in a seeded order), keyed by the task
and the hop, so runs are reproducible.

:func:`swarm` is the DSL workflow, :func:`swarm_app` the same app in LangGraph with
``Command(goto=...)`` hand-offs. State keys: ``task`` (input), ``hops``, ``last``.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, TypedDict

from kvflow_orch import END, START, Workflow

from ._filler import filler
from ._routing import draw, named_choice, zipf_weights

__all__ = ["swarm", "swarm_app", "routing", "agent_names", "workflow"]



class SwarmState(TypedDict, total=False):
    task: str
    hops: int
    last: str

def agent_names(agents: int) -> list[str]:
    return [f"agent_{i}" for i in range(agents)]


def routing(agents: int = 6, zipf_s: float = 1.2, seed: int = 0) -> dict[str, dict[str, float]]:
    """The transition matrix: agent -> next agent -> weight."""
    if not isinstance(agents, int) or agents < 2:
        raise ValueError(f"a swarm needs at least 2 agents, got {agents!r}")
    names = agent_names(agents)
    weights = zipf_weights(agents - 1, zipf_s)
    rng = random.Random(seed)
    matrix = {}
    for name in names:
        others = [n for n in names if n != name]
        rng.shuffle(others)
        matrix[name] = dict(zip(others, weights, strict=True))
    return matrix


def _check_hops(hops: int) -> None:
    if not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops must be a positive integer, got {hops!r}")


def _roles(names: list[str], fixed: int) -> dict[str, str]:
    return {n: f"You are {n} of a swarm of agents. Answer, then hand off with 'NEXT: <agent>'. " + filler(fixed, n)
            for n in names}


def _next(name: str, state: Mapping[str, Any], matrix: Mapping[str, Mapping[str, float]], hops: int, seed: int) -> str:
    if state.get("hops", 0) >= hops:
        return END
    row = matrix[name]
    return (named_choice(state.get("last", ""), list(row))
            or draw(row, seed, state.get("task", ""), state.get("hops", 0)))


def swarm(agents: int = 6, zipf_s: float = 1.2, hops: int = 8, fixed: int = 256, dynamic: int = 16,
          output: int = 16, seed: int = 0) -> Workflow:
    """The DSL workflow: ``hops`` agent turns in all, each with conditional edges to every other agent."""
    _check_hops(hops)
    matrix = routing(agents, zipf_s, seed)
    names = list(matrix)
    roles = _roles(names, fixed)
    wf = Workflow("swarm")
    for name in names:
        async def act(ctx, state, name=name):
            hop = state.get("hops", 0) + 1
            reply = await ctx.llm(f"Task: {state.get('task', '')}. Hop {hop}. "
                                  + filler(dynamic, (name, state.get("task"), hop)))
            return {"hops": hop, "last": reply}

        wf.agent(name, system=roles[name], max_tokens=output)(act)
        wf.add_conditional_edges(name, lambda s, n=name: _next(n, s, matrix, hops, seed), [*matrix[name], END])
    wf.add_edge(START, names[0])
    return wf


def swarm_app(llm: Any, agents: int = 6, zipf_s: float = 1.2, hops: int = 8, fixed: int = 256, dynamic: int = 16,
              seed: int = 0) -> Any:
    """The same app as a compiled LangGraph graph whose agents return ``Command(goto=...)``."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.graph import END as LG_END, START as LG_START, StateGraph
    from langgraph.types import Command

    _check_hops(hops)
    matrix = routing(agents, zipf_s, seed)
    names = list(matrix)
    roles = _roles(names, fixed)


    def agent(name: str):
        def run(state: SwarmState) -> Command:
            hop = state.get("hops", 0) + 1
            reply = llm.invoke([SystemMessage(roles[name]), HumanMessage(
                f"Task: {state.get('task', '')}. Hop {hop}. " + filler(dynamic, (name, state.get("task"), hop)))])
            update = {"hops": hop, "last": reply.content}
            target = _next(name, {**state, **update}, matrix, hops, seed)
            return Command(update=update, goto=LG_END if target == END else target)
        return run

    graph = StateGraph(SwarmState)
    for name in names:
        graph.add_node(name, agent(name), destinations=(*matrix[name], LG_END))
    graph.add_edge(LG_START, names[0])
    return graph.compile(name="swarm")


workflow = swarm
