"""instrument(): a real LangGraph app whose nodes call ChatOpenAI against a real HTTP server on
127.0.0.1. For every call the server must receive the calling agent and the exact steps map the ASG
semantics give at that moment — parallel nodes, an AND-join, a conditional loop, concurrent runs —
and the fallback server (no /kvflow/v1/info) must receive no hints after one warning."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import TypedDict

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from kvflow_orch.langgraph import (
    PlainServerWarning,
    async_http_client,
    handler_of,
    http_client,
    instrument,
)

INF = None  # "not expected again" on the wire


class State(TypedDict, total=False):
    run: str
    rounds: int


def chat_model(url: str) -> ChatOpenAI:
    return ChatOpenAI(
        model="recorder",
        base_url=url + "/v1",
        api_key="test",
        max_retries=0,
        http_client=http_client(),
        http_async_client=async_http_client(),
    )


def software_company(url: str, *, use_async: bool = False):
    """pm -> (fe || be) -> AND -> engineer -> qa -> fix: engineer | ship: END (one fix round)."""
    llm = chat_model(url)
    barriers: dict[str, object] = {}
    lock = threading.Lock()

    def messages(role: str, state: State):
        return [SystemMessage(f"You are the {role}. " * 20), HumanMessage(f"work on {state['run']}")]

    def barrier(run: str):
        with lock:  # fe and be of one run both run when either calls: the steps are deterministic
            return barriers.setdefault(run, asyncio.Barrier(2) if use_async else threading.Barrier(2, timeout=10))

    def agent(role: str, meet: bool = False):
        if use_async:

            async def node(state: State) -> dict:
                if meet:
                    await asyncio.wait_for(barrier(state["run"]).wait(), 10)
                await llm.ainvoke(messages(role, state))
                return {"rounds": state.get("rounds", 0) + 1} if role == "qa" else {}
        else:

            def node(state: State) -> dict:
                if meet:
                    barrier(state["run"]).wait()
                llm.invoke(messages(role, state))
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


# What the ASG semantics give at each call (worked by hand from issue 2's equations).
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


def assert_steps_updates(server, workflow_ids) -> None:
    for wid in workflow_ids:
        updates = [u for u in server.steps_updates() if u["workflow_id"] == wid]
        assert updates and updates[-1]["done"] is True and updates[-1]["namespace"] == "shop"
        assert all(not u["done"] for u in updates[:-1])


def test_sync_invoke_sends_exact_steps_on_every_call(server, strict_tracking):
    app = instrument(software_company(server.url), namespace="shop", backend_url=server.url)
    app.invoke({"run": "r1"}, {"metadata": {"kvflow_workflow_id": "wf-1"}})
    handler_of(app).backend.flush()
    assert list(calls_by_workflow(server)) == ["wf-1"]
    assert in_call_order(calls_by_workflow(server)["wf-1"]) == EXPECTED
    assert_steps_updates(server, ["wf-1"])
    assert handler_of(app).open_runs == 0
    handler_of(app).backend.close()


def test_concurrent_runs_are_attributed_to_their_own_workflow(server, strict_tracking):
    app = instrument(software_company(server.url), namespace="shop", backend_url=server.url)
    app.batch(
        [{"run": "a"}, {"run": "b"}],
        [{"configurable": {"thread_id": "thread-a"}}, {"metadata": {"kvflow_workflow_id": "wf-b"}}],
    )
    handler_of(app).backend.flush()
    calls = calls_by_workflow(server)
    assert sorted(calls) == ["thread-a", "wf-b"]
    for wid in calls:
        assert in_call_order(calls[wid]) == EXPECTED
    assert_steps_updates(server, ["thread-a", "wf-b"])
    assert handler_of(app).open_runs == 0
    handler_of(app).backend.close()


async def test_async_graph_concurrent_ainvoke(server, strict_tracking):
    app = instrument(software_company(server.url, use_async=True), namespace="shop", backend_url=server.url)
    await asyncio.gather(
        app.ainvoke({"run": "x"}, {"metadata": {"kvflow_workflow_id": "wf-x"}}),
        app.ainvoke({"run": "y"}, {"metadata": {"kvflow_workflow_id": "wf-y"}}),
    )
    await asyncio.to_thread(handler_of(app).backend.flush)
    calls = calls_by_workflow(server)
    assert sorted(calls) == ["wf-x", "wf-y"]
    for wid in calls:
        assert in_call_order(calls[wid]) == EXPECTED
    assert_steps_updates(server, ["wf-x", "wf-y"])
    handler_of(app).backend.close()


def test_stream_and_default_workflow_id(server, strict_tracking):
    app = instrument(software_company(server.url), namespace="shop")  # backend learned from calls
    chunks = list(app.stream({"run": "s"}, stream_mode="updates"))
    assert len(chunks) == len(EXPECTED)
    handler_of(app).backend.flush()
    calls = calls_by_workflow(server)
    (wid,) = calls  # the root run id
    assert len(wid) == 36
    assert in_call_order(calls[wid]) == EXPECTED
    assert_steps_updates(server, [wid])
    handler_of(app).backend.close()


def test_plain_server_gets_no_hints_and_one_warning(plain_server):
    app = instrument(software_company(plain_server.url), namespace="shop", backend_url=plain_server.url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app.invoke({"run": "p1"})
        app.invoke({"run": "p2"})
    plain = [w for w in caught if issubclass(w.category, PlainServerWarning)]
    assert len(plain) == 1 and "/kvflow/v1/info" in str(plain[0].message)
    assert len(plain_server.chats()) == 2 * len(EXPECTED)
    assert all("custom_params" not in body for body in plain_server.chats())
    assert plain_server.steps_updates() == []
    handler_of(app).backend.close()


def test_calls_outside_instrumented_nodes_are_untouched(server):
    llm = chat_model(server.url)
    llm.invoke([HumanMessage("hello")])
    assert server.hints() == [None]
