"""instrument() on the harder LangGraph constructs: a conditional START, Send fan-out (k tasks of
one node), a Command router, the raw openai SDK, interrupt + resume, a non-LLM node, retries, error
handlers and failing runs. Each asserts the exact steps the server received, or that the backend
was told ``done``."""

from __future__ import annotations

import operator
import threading
import time
from typing import Annotated, Literal, TypedDict

import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

from kvflow_orch.langgraph import handler_of, http_client, instrument

INF = None


class State(TypedDict, total=False):
    topic: str
    parts: Annotated[list, operator.add]
    answer: str


def llm_for(url: str) -> ChatOpenAI:
    return ChatOpenAI(model="recorder", base_url=url + "/v1", api_key="test", max_retries=0, http_client=http_client())


def ask(llm: ChatOpenAI, role: str) -> str:
    return llm.invoke([SystemMessage(f"You are the {role}."), HumanMessage("go")]).content


def hints_of(server, wid: str) -> list[tuple[str, dict]]:
    return [(h["agent"], h["steps"]) for h in server.hints() if h and h["workflow_id"] == wid]


def updates_of(server, wid: str) -> list[dict]:
    return [u for u in server.steps_updates() if u["workflow_id"] == wid]


def chain(**nodes) -> StateGraph:
    """START -> each node in the order given."""
    g = StateGraph(State)
    previous = START
    for name, fn in nodes.items():
        g.add_node(name, fn)
        g.add_edge(previous, name)
        previous = name
    return g


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)




def test_conditional_start_send_and_command(server, strict_tracking):
    llm = llm_for(server.url)
    raw = openai.OpenAI(base_url=server.url + "/v1", api_key="test", http_client=http_client(), max_retries=0)
    meet = threading.Barrier(2, timeout=10)

    def plan(state: State) -> dict:
        ask(llm, "planner")
        return {}

    def scatter(state: State):
        return [Send("worker", {"topic": "a"}), Send("worker", {"topic": "b"})]

    def worker(state: State) -> dict:
        meet.wait()  # both Send tasks are running when either calls
        return {"parts": [ask(llm, "worker")]}

    def reduce(state: State) -> Command[Literal["plan", "__end__"]]:
        raw.chat.completions.create(model="recorder", messages=[{"role": "system", "content": "reducer"},
                                                                 {"role": "user", "content": "merge"}])
        return Command(goto=END)

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("worker", worker)
    g.add_node("reduce", reduce)
    g.add_conditional_edges(START, lambda s: "go", {"go": "plan", "skip": END})
    g.add_conditional_edges("plan", scatter, ["worker"])
    g.add_edge("worker", "reduce")
    app = instrument(g.compile(), backend_url=server.url)
    app.invoke({"topic": "t"}, {"metadata": {"kvflow_workflow_id": "fan"}})
    handler_of(app).backend.flush()
    assert hints_of(server, "fan") == [
        ("plan", {"plan": 0, "worker": 1, "reduce": 2}),
        ("worker", {"plan": 2, "worker": 0, "reduce": 1}),
        ("worker", {"plan": 2, "worker": 0, "reduce": 1}),
        ("reduce", {"plan": 1, "worker": 2, "reduce": 0}),
    ]
    assert updates_of(server, "fan")[-1] == {
        "workflow_id": "fan", "namespace": "default", "steps": {"plan": INF, "worker": INF, "reduce": INF},
        "done": True,
    }
    assert handler_of(app).open_runs == 0
    handler_of(app).backend.close()


def test_interrupt_resume_keeps_the_workflow_and_non_llm_nodes_post(server, strict_tracking):
    llm = llm_for(server.url)

    def draft(state: State) -> dict:
        return {"answer": ask(llm, "drafter")}

    def review(state: State) -> dict:  # a human step: no LLM
        wait_for(lambda: updates_of(server, "t-7"))  # its start was posted, without blocking it
        return {"answer": interrupt("approve?")}

    def publish(state: State) -> dict:
        ask(llm, "publisher")
        return {}

    g = chain(draft=draft, review=review, publish=publish)
    app = instrument(g.compile(checkpointer=InMemorySaver()), agents={"review": None}, backend_url=server.url)
    config = {"configurable": {"thread_id": "t-7"}}
    first = app.invoke({"topic": "t"}, config)
    assert "__interrupt__" in first
    handler_of(app).backend.flush()
    paused = updates_of(server, "t-7")
    # review (non-LLM) started: the backend heard the steps no hint would carry
    assert paused[0] == {"workflow_id": "t-7", "namespace": "default", "steps": {"draft": INF, "publish": 1},
                         "done": False}
    assert paused[-1]["done"] is True  # the backend may drop the workflow while a human decides

    app.invoke(Command(resume="yes"), config)
    handler_of(app).backend.flush()
    assert hints_of(server, "t-7") == [
        ("draft", {"draft": 0, "publish": 2}),
        ("publish", {"draft": INF, "publish": 0}),  # the resumed run continued the same tracker
    ]
    assert updates_of(server, "t-7")[-1]["done"] is True
    assert handler_of(app).open_runs == 0
    handler_of(app).backend.close()


def test_retry_and_failure_tell_the_backend_done(server, strict_tracking):
    llm = llm_for(server.url)
    attempts = {"flaky": 0}

    def flaky(state: State) -> dict:
        attempts["flaky"] += 1
        ask(llm, "flaky")
        if attempts["flaky"] == 1:
            raise ValueError("transient")
        return {}

    def broken(state: State) -> dict:
        raise RuntimeError("node broken failed")

    g = StateGraph(State)
    g.add_node("flaky", flaky,
               retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False, retry_on=ValueError))
    g.add_node("broken", broken)
    g.add_edge(START, "flaky")
    g.add_edge("flaky", "broken")
    app = instrument(g.compile(), backend_url=server.url)
    with pytest.raises(RuntimeError, match="node broken failed"):
        app.invoke({"topic": "t"}, {"metadata": {"kvflow_workflow_id": "err"}})
    handler_of(app).backend.flush()
    # the retried task is the same execution for the tracker: both calls see flaky running
    assert hints_of(server, "err") == [("flaky", {"flaky": 0, "broken": 1})] * 2
    assert updates_of(server, "err")[-1]["done"] is True
    assert handler_of(app).open_runs == 0
    handler_of(app).backend.close()


def test_error_handler_completes_the_failed_node(server, strict_tracking):
    llm = llm_for(server.url)

    def fails(state: State) -> dict:
        raise ValueError("boom")

    def fallback(state: State) -> Command:
        return Command(goto="after", update={"answer": "fallback"})

    def after(state: State) -> dict:
        ask(llm, "after")
        return {}

    g = StateGraph(State)
    g.add_node("fails", fails, error_handler=fallback)
    g.add_node("after", after)
    g.add_edge(START, "fails")
    g.add_edge("fails", "after")
    app = instrument(g.compile(), backend_url=server.url)
    assert app.invoke({"topic": "t"}, {"metadata": {"kvflow_workflow_id": "eh"}})["answer"] == "fallback"
    handler_of(app).backend.flush()
    assert hints_of(server, "eh") == [("after", {"fails": INF, "after": 0})]
    assert updates_of(server, "eh")[-1]["done"] is True
    assert handler_of(app).open_runs == 0
    handler_of(app).backend.close()


@pytest.mark.parametrize("inner", ["plain", "instrumented"])
def test_calls_inside_a_subgraph_are_agents_named_by_their_path(server, strict_tracking, inner):
    llm = llm_for(server.url)

    def inner_step(state: State) -> dict:
        ask(llm, "inner")
        return {}

    sub = chain(inner_step=inner_step).compile()
    if inner == "instrumented":  # defers to the outer graph: one identity, one workflow
        sub = instrument(sub, namespace="inner", backend_url=server.url)

    def final(state: State) -> dict:
        ask(llm, "final")
        return {}

    g = chain(research=sub, final=final)
    app = instrument(g.compile(), agents={"research": "researcher"}, backend_url=server.url)
    app.invoke({"topic": "t"}, {"metadata": {"kvflow_workflow_id": "sub"}})
    assert hints_of(server, "sub") == [
        ("researcher/inner_step", {"researcher": 0, "final": 1, "researcher/inner_step": 0}),
        ("final", {"researcher": INF, "final": 0, "researcher/inner_step": INF}),
    ]
    handler_of(app).backend.flush()
    assert updates_of(server, "sub")[-1] == {
        "workflow_id": "sub",
        "namespace": "default",
        "steps": {"researcher": INF, "final": INF, "researcher/inner_step": INF},
        "done": True,
    }
    assert {u["namespace"] for u in server.steps_updates()} == {"default"}
    assert handler_of(app).open_runs == 0


def test_first_update_probes_the_server_off_the_graph_thread(server, strict_tracking):
    llm = llm_for(server.url)

    def prepare(state: State) -> dict:  # non-LLM and first: nothing has probed the server yet
        wait_for(lambda: updates_of(server, "probe"))
        return {}

    def write(state: State) -> dict:
        ask(llm, "writer")
        return {}

    g = chain(prepare=prepare, write=write)
    app = instrument(g.compile(), agents={"prepare": None}, backend_url=server.url)
    app.invoke({"topic": "t"}, {"metadata": {"kvflow_workflow_id": "probe"}})
    handler_of(app).backend.flush()
    assert [r.path for r in server.requests].count("/kvflow/v1/info") == 1
    assert updates_of(server, "probe")[0]["steps"] == {"write": 1}
    assert hints_of(server, "probe") == [("write", {"write": 0})]
    assert updates_of(server, "probe")[-1]["done"] is True
    handler_of(app).backend.close()
