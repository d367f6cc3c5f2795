"""instrument(): a real LangGraph app whose nodes call ChatOpenAI against a real HTTP server on
127.0.0.1. For every call the server must receive the calling agent and the exact steps map the ASG
semantics give at that moment — parallel nodes, an AND-join, a conditional loop, concurrent runs —
and the fallback server (no /kvflow/v1/info) must receive no hints after one warning."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from langchain_core.messages import HumanMessage
from lg_apps import EXPECTED, calls_by_workflow, chat_model, in_call_order, software_company

from kvflow_orch.langgraph import PlainServerWarning, TrackingWarning, handler_of, instrument


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


@pytest.mark.parametrize("async_nodes", [True, False], ids=["async-nodes", "sync-nodes"])
async def test_async_graph_concurrent_ainvoke(server, strict_tracking, async_nodes):
    graph = software_company(server.url, use_async=async_nodes)
    app = instrument(graph, namespace="shop", backend_url=server.url)
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


def test_bad_arguments_are_clear_errors(server):
    from kvflow_orch import WorkflowError

    graph = software_company(server.url)
    with pytest.raises(WorkflowError, match="graph.compile\\(\\)"):
        instrument(graph.builder)
    with pytest.raises(ValueError, match="backend_url"):
        instrument(graph, backend_url="127.0.0.1:8000")
    with pytest.raises(WorkflowError, match="ghost"):
        instrument(graph, agents={"ghost": "x"})
    from langgraph.func import entrypoint

    @entrypoint()
    def functional(x: int) -> int:
        return x

    with pytest.raises(WorkflowError, match="functional API"):
        instrument(functional)


def test_an_invalid_workflow_id_falls_back_to_the_root_run_id(server):
    app = instrument(software_company(server.url), namespace="shop", backend_url=server.url)
    with pytest.warns(TrackingWarning, match="workflow id is 300 characters long"):
        app.invoke({"run": "long"}, {"metadata": {"kvflow_workflow_id": "w" * 300}})
    handler_of(app).backend.flush()
    (wid,) = calls_by_workflow(server)
    assert len(wid) == 36  # the root run id
    assert in_call_order(calls_by_workflow(server)[wid]) == EXPECTED
    assert_steps_updates(server, [wid])
    with pytest.raises(ValueError, match="namespace is 257 characters long"):
        instrument(software_company(server.url), namespace="n" * 257)
    handler_of(app).backend.close()
