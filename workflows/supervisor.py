"""A supervisor routing work to K workers, the shape of ``langgraph-supervisor`` apps.

START -> supervisor -> (one worker | END); every worker reports back to the supervisor. The
supervisor decides ``rounds`` times, then ends. Its choice is what a routing model would produce:
the worker its reply names as ``NEXT: <worker>``, or else a draw from a seeded Zipf distribution
over the workers (``zipf_s``; worker 0 is the most popular), keyed by the task and the turn, so
runs are reproducible and the route does not depend on the model's text.

    kvflow run workflows.supervisor:workflow --input '{"task": "triage ticket 42"}'

:func:`supervisor` is the DSL workflow, :func:`supervisor_app` the same app in LangGraph
(conditional edges out of the supervisor). :func:`routing` gives the simulator the weights.
State keys: ``task`` (input), ``turn``, ``plan``, ``work``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypedDict

from kvflow_orch import END, START, Workflow

from ._filler import filler
from ._routing import draw, named_choice, zipf_weights

__all__ = ["supervisor", "supervisor_app", "routing", "worker_names", "workflow"]



class SupervisorState(TypedDict, total=False):
    task: str
    turn: int
    plan: str
    work: str

def worker_names(workers: int) -> list[str]:
    return [f"worker_{i}" for i in range(workers)]


def routing(workers: int = 8, zipf_s: float = 1.2,
            weights: Sequence[float] | None = None) -> dict[str, dict[str, float]]:
    """Router -> target -> weight of the worker choice (END comes after ``rounds`` decisions):
    Zipf(``zipf_s``), or ``weights`` (one per worker, normalised) when given."""
    if weights is not None:
        if len(weights) != workers or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights must be {workers} non-negative numbers with a positive sum, got {weights!r}")
        return {"supervisor": {n: w / sum(weights) for n, w in zip(worker_names(workers), weights, strict=True)}}
    return {"supervisor": dict(zip(worker_names(workers), zipf_weights(workers, zipf_s), strict=True))}


def _check(workers: int, rounds: int) -> None:
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")


def _roles(workers: int, fixed: int) -> tuple[str, list[str]]:
    names = worker_names(workers)
    boss = ("You are the supervisor of a team: " + ", ".join(names) + ". Read the task and the work so far, "
            "then name the worker to act next as 'NEXT: <worker>'. " + filler(fixed, "supervisor"))
    return boss, [f"You are {n}, a specialist of the team. " + filler(fixed, n) for n in names]


def _route(state: Mapping[str, Any], names: list[str], weights: Mapping[str, float], rounds: int, seed: int) -> str:
    if state.get("turn", 0) > rounds:
        return END
    return (named_choice(state.get("plan", ""), names)
            or draw(weights, seed, state.get("task", ""), state.get("turn", 0)))


def supervisor(workers: int = 8, zipf_s: float = 1.2, rounds: int = 6, fixed: int = 256, dynamic: int = 16,
               output: int = 16, seed: int = 0, weights: Sequence[float] | None = None) -> Workflow:
    """The DSL workflow: ``fixed`` filler tokens per role prompt, ``dynamic`` per request, ``output``
    reply tokens; the supervisor runs ``rounds + 1`` times and workers ``rounds`` times in all.
    ``weights``: the routing weights of the workers instead of Zipf(``zipf_s``)."""
    _check(workers, rounds)
    names = worker_names(workers)
    weights = routing(workers, zipf_s, weights)["supervisor"]
    boss, roles = _roles(workers, fixed)
    wf = Workflow("supervisor")

    @wf.agent("supervisor", system=boss, max_tokens=output)
    async def supervise(ctx, state):
        turn = state.get("turn", 0) + 1
        reply = await ctx.llm(f"Task: {state.get('task', '')}. Turn {turn}. "
                              + filler(dynamic, (state.get("task"), turn)))
        return {"turn": turn, "plan": reply}

    for name, role in zip(names, roles, strict=True):
        wf.add_agent(name, system=role, output="work", max_tokens=output,
                     prompt=lambda s, n=name: f"{n}: do turn {s.get('turn', 0)} of {s.get('task', '')}. "
                     + filler(dynamic, (n, s.get("task"), s.get("turn"))))
        wf.add_edge(name, "supervisor")
    wf.add_edge(START, "supervisor")
    wf.add_conditional_edges("supervisor", lambda s: _route(s, names, weights, rounds, seed), names + [END])
    return wf


def supervisor_app(llm: Any, workers: int = 8, zipf_s: float = 1.2, rounds: int = 6, fixed: int = 256,
                   dynamic: int = 16, seed: int = 0) -> Any:
    """The same app as a compiled LangGraph graph; ``llm`` is a LangChain chat model."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.graph import END as LG_END, START as LG_START, StateGraph

    _check(workers, rounds)
    names = worker_names(workers)
    weights = routing(workers, zipf_s)["supervisor"]
    boss, roles = _roles(workers, fixed)


    def supervise(state: SupervisorState) -> dict:
        turn = state.get("turn", 0) + 1
        reply = llm.invoke([SystemMessage(boss), HumanMessage(f"Task: {state.get('task', '')}. Turn {turn}. "
                                                              + filler(dynamic, (state.get("task"), turn)))])
        return {"turn": turn, "plan": reply.content}

    def worker(name: str, role: str):
        def run(state: SupervisorState) -> dict:
            reply = llm.invoke([SystemMessage(role), HumanMessage(f"{name}: do turn {state.get('turn', 0)}. "
                                                                  + filler(dynamic, (name, state.get("task"))))])
            return {"work": reply.content}
        return run

    def route(state: SupervisorState) -> str:
        target = _route(state, names, weights, rounds, seed)
        return LG_END if target == END else target

    graph = StateGraph(SupervisorState)
    graph.add_node("supervisor", supervise)
    for name, role in zip(names, roles, strict=True):
        graph.add_node(name, worker(name, role))
        graph.add_edge(name, "supervisor")
    graph.add_edge(LG_START, "supervisor")
    graph.add_conditional_edges("supervisor", route, [*names, LG_END])
    return graph.compile(name="supervisor")


workflow = supervisor
