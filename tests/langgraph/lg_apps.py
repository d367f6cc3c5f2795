"""The LangGraph app the instrumentation tests drive, and the steps its calls must carry."""

from __future__ import annotations

import asyncio
import threading
from typing import TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from kvflow_orch.langgraph import async_http_client, http_client

INF = None  # "not expected again" on the wire


class State(TypedDict, total=False):
    run: str
    rounds: int


def chat_model(url: str, model: str = "recorder", **kwargs) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=url + "/v1",
        api_key="test",
        max_retries=0,
        http_client=http_client(),
        http_async_client=async_http_client(),
        **kwargs,
    )


def software_company(url: str, *, use_async: bool = False, **llm_kwargs):
    """pm -> (fe || be) -> AND -> engineer -> qa -> fix: engineer | ship: END (one fix round)."""
    llm = chat_model(url, **llm_kwargs)
    barriers: dict[str, object] = {}
    lock = threading.Lock()

    def messages(role: str, state: State):
        return [SystemMessage(f"You are the {role}. " * 20), HumanMessage(f"work on {state['run']}")]

    def barrier(run: str):
        with lock:  # fe and be of one run both run while either calls: the steps are deterministic
            return barriers.setdefault(run, asyncio.Barrier(2) if use_async else threading.Barrier(2, timeout=10))

    def agent(role: str, meet: bool = False):
        if use_async:

            async def node(state: State) -> dict:
                if meet:
                    await asyncio.wait_for(barrier(state["run"]).wait(), 10)
                await llm.ainvoke(messages(role, state))
                if meet:  # neither finishes before both requests went out
                    await asyncio.wait_for(barrier(state["run"]).wait(), 10)
                return {"rounds": state.get("rounds", 0) + 1} if role == "qa" else {}
        else:

            def node(state: State) -> dict:
                if meet:
                    barrier(state["run"]).wait()
                llm.invoke(messages(role, state))
                if meet:  # neither finishes before both requests went out
                    barrier(state["run"]).wait()
                return {"rounds": state.get("rounds", 0) + 1} if role == "qa" else {}

        return node

    def qa_route(state: State) -> str:
        return "fix" if state["rounds"] < 2 else "ship"

    g = StateGraph(State)
    for role in ["pm", "engineer", "qa"]:
        g.add_node(role, agent(role))
    g.add_node("fe", agent("fe", meet=True))
    g.add_node("be", agent("be", meet=True))
    g.add_edge(START, "pm")
    g.add_edge("pm", "fe")
    g.add_edge("pm", "be")
    g.add_edge(["fe", "be"], "engineer")
    g.add_edge("engineer", "qa")
    g.add_conditional_edges("qa", qa_route, {"fix": "engineer", "ship": END})
    return g.compile()


# What the ASG semantics give at each call (worked by hand from the steps equations in kvflow_orch/_steps.py).
EXPECTED = [
    ("pm", {"pm": 0, "fe": 1, "be": 1, "engineer": 2, "qa": 3}),
    ("be", {"pm": INF, "fe": 0, "be": 0, "engineer": 1, "qa": 2}),  # be || fe: both running
    ("fe", {"pm": INF, "fe": 0, "be": 0, "engineer": 1, "qa": 2}),
    ("engineer", {"pm": INF, "fe": INF, "be": INF, "engineer": 0, "qa": 1}),
    ("qa", {"pm": INF, "fe": INF, "be": INF, "engineer": 1, "qa": 0}),
    ("engineer", {"pm": INF, "fe": INF, "be": INF, "engineer": 0, "qa": 1}),  # the fix loop
    ("qa", {"pm": INF, "fe": INF, "be": INF, "engineer": 1, "qa": 0}),
]


def calls_by_workflow(server) -> dict[str, list[tuple[str, dict]]]:
    out: dict[str, list[tuple[str, dict]]] = {}
    for hint in server.hints():
        assert hint is not None, "every call inside a node carries a hint"
        assert hint["fixed_prefix"] == 1 and hint["namespace"] == "shop"
        out.setdefault(hint["workflow_id"], []).append((hint["agent"], hint["steps"]))
    return out


def in_call_order(calls):
    # fe and be run in parallel: their relative order is the only freedom.
    return calls[:1] + sorted(calls[1:3], key=lambda c: c[0]) + calls[3:]
