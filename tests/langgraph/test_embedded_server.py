"""instrument() end to end against the real embedded kvflow server (tiny-random engine, uvicorn on
127.0.0.1): the engine receives every call with the agent, the exact steps and a fixed prefix, for
plain and streaming (``stream_mode="messages"``) runs, and the steps updates end with done."""

from __future__ import annotations

import math
import os
import sys

import pytest

from lg_apps import EXPECTED, in_call_order, software_company
from server_helpers import start_server

from kvflow_orch.langgraph import handler_of, instrument
from kvflow_orch.protocol import steps_as_json


@pytest.fixture(scope="module")
def served():
    with start_server() as s:
        yield s


def engine_calls(served, wid: str):
    out = []
    for route, request in list(served.requests):
        hint = request.hint
        assert hint is not None and route == "chat"
        if hint.workflow_id == wid:
            assert hint.namespace == "shop" and hint.fixed_prefix == 1
            assert request.fixed_prefix_tokens and request.fixed_prefix_tokens < len(request.input_ids)
            out.append((hint.agent, steps_as_json(hint.steps)))  # EXPECTED is in the wire form
    return out


@pytest.mark.parametrize("mode", ["invoke", "stream-messages"])
def test_embedded_server_receives_exact_steps(served, strict_tracking, mode):
    graph = software_company(served.url, model="tiny-random", max_tokens=3)
    app = instrument(graph, namespace="shop", backend_url=served.url)
    wid = f"wf-{mode}"
    config = {"metadata": {"kvflow_workflow_id": wid}}
    if mode == "invoke":
        app.invoke({"run": wid}, config)
    else:  # ChatOpenAI switches to SSE streaming under stream_mode="messages"
        tokens = list(app.stream({"run": wid}, config, stream_mode="messages"))
        assert tokens
    handler_of(app).backend.flush()
    assert in_call_order(engine_calls(served, wid)) == EXPECTED
    updates = [u for u in served.steps if u.workflow_id == wid]
    assert updates and updates[-1].done and not any(u.done for u in updates[:-1])
    handler_of(app).backend.close()


def test_example_app_runs_with_hints(served, monkeypatch, capsys):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "langgraph_app.py")
    spec = importlib.util.spec_from_file_location("langgraph_app_example", path)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # LangGraph resolves the state's type hints there
    spec.loader.exec_module(example)
    argv = ["langgraph_app.py", "--url", served.url, "--model", "tiny-random", "--max-tokens", "3"]
    monkeypatch.setattr(sys, "argv", argv)
    example.main()
    assert "draft after 2 review(s)" in capsys.readouterr().out
    hints = [r.hint for _, r in served.requests if r.hint and r.hint.namespace == "article-writer"]
    agents = [h.agent for h in hints]
    assert agents[0] == "planner" and sorted(agents[1:3]) == ["outliner", "researcher"]
    assert agents[3:] == ["writer", "reviewer", "writer", "reviewer"]
    assert hints[0].steps == {"planner": 0, "researcher": 1, "outliner": 1, "writer": 2, "reviewer": 3}
    inf = math.inf  # the server holds steps in their Python form
    assert hints[-1].steps == {"planner": inf, "researcher": inf, "outliner": inf, "writer": 1, "reviewer": 0}


def test_api_key_server_gets_hints_and_updates_with_kvflow_api_key(monkeypatch):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from kvflow_orch.langgraph import async_http_client, http_client

    class State(TypedDict, total=False):
        reply: str

    monkeypatch.setenv("KVFLOW_API_KEY", "s3cret")
    with start_server(api_key="s3cret") as served:
        llm = ChatOpenAI(model="tiny-random", base_url=served.url + "/v1", api_key="s3cret", max_tokens=2,
                         max_retries=0, http_client=http_client(), http_async_client=async_http_client())
        g = StateGraph(State)
        g.add_node("writer", lambda s: {"reply": llm.invoke([HumanMessage("hi")]).content})
        g.add_edge(START, "writer")
        g.add_edge("writer", END)
        app = instrument(g.compile(), namespace="keyed", backend_url=served.url)
        app.invoke({}, {"metadata": {"kvflow_workflow_id": "wf-key"}})
        handler_of(app).backend.flush()
        handler_of(app).backend.close()
        (hint,) = [r.hint for _, r in served.requests]
        assert hint is not None and hint.workflow_id == "wf-key" and hint.agent == "writer"
        assert [u.done for u in served.steps if u.workflow_id == "wf-key"][-1] is True
