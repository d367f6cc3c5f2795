"""Faults end cleanly: a clear WorkflowError naming the node (and the URL), the backend told the
workflow is done, and no task or worker thread of the run left behind. Also the state-merge rules
(reducers, last-write-wins, concurrent writes) and max_steps."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from recording_server import Behaviour, RecordingServer

from kvflow_orch import END, START, Workflow, WorkflowError
from kvflow_orch.runtime import arun, run


def _done_sent(server, workflow_id: str) -> bool:
    return any(u["workflow_id"] == workflow_id and u["done"] for u in server.steps_updates())


def _no_leftovers() -> None:
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert not [t for t in threading.enumerate() if t.name.startswith("kvflow-agent")]


def chain(router, path_map) -> Workflow:
    wf = Workflow("faulty")
    wf.add_agent("a", system="A.", prompt="go", output="x")
    wf.add_conditional_edges("a", router, path_map)
    wf.add_agent("b", system="B.", prompt="{x}", output="y")
    wf.add_edge(START, "a")
    return wf


async def test_router_unknown_key_names_node_and_key(server):
    wf = chain(lambda s: "maybe", {"yes": "b", "no": END})
    with pytest.raises(WorkflowError, match=r"router of node 'a' returned 'maybe'.*\['no', 'yes'\]"):
        await arun(wf, {}, backend=server.url, workflow_id="w-router")
    assert _done_sent(server, "w-router")
    _no_leftovers()


async def test_router_may_return_a_node_name_or_end(server):
    result = await arun(chain(lambda s: "b", {"yes": "b", "no": END}), {}, backend=server.url)
    assert [r.node for r in result.trace] == ["a", "b"]
    result = await arun(chain(lambda s: END, {"yes": "b", "no": END}), {}, backend=server.url)
    assert [r.node for r in result.trace] == ["a"]


async def test_node_raising_cancels_siblings(server):
    server.behaviour.delay_s = 2.0  # the sibling LLM call would take long
    wf = Workflow("raise")
    wf.add_node("split", lambda s: None)
    wf.add_agent("slow", system="S.", prompt="p")

    async def boom(state):
        deadline = time.monotonic() + 1.0
        while not server.chats() and time.monotonic() < deadline:  # the slow call is in flight
            await asyncio.sleep(0.01)
        raise KeyError("missing-input")

    wf.add_node("boom", boom)
    wf.add_edge(START, "split")
    wf.add_edge("split", "slow")
    wf.add_edge("split", "boom")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(WorkflowError, match=r"node 'boom' raised KeyError: 'missing-input'"):
        await arun(wf, {}, backend=server.url, workflow_id="w-raise")
    assert loop.time() - started < 1.5, "the slow sibling was not cancelled"
    assert len(server.chats()) == 1  # the server heard of the workflow from the slow call's hint
    assert _done_sent(server, "w-raise")
    _no_leftovers()


async def test_backend_down_mid_workflow_names_node_and_url():
    srv = RecordingServer().start()
    wf = Workflow("down")
    wf.add_agent("first", system="F.", prompt="p", output="x")
    wf.add_node("outage", lambda s: srv.stop())
    wf.add_agent("second", system="S.", prompt="{x}")
    wf.add_edge(START, "first")
    wf.add_edge("first", "outage")
    wf.add_edge("outage", "second")
    with pytest.raises(WorkflowError, match=rf"node 'second': LLM call failed: .*failed after \d+ attempts.*{srv.url}"):
        await arun(wf, {}, backend=srv.url)
    assert len(srv.chats()) == 1
    _no_leftovers()


async def test_garbage_reply_names_node_and_url():
    srv = RecordingServer(Behaviour(garbage=True)).start()
    try:
        with pytest.raises(WorkflowError,
                           match=rf"node 'a': LLM call failed: reply is not a chat completion.*{srv.url}"):
            await arun(chain(lambda s: END, ["b", END]), {}, backend=srv.url, workflow_id="w-garbage")
        assert _done_sent(srv, "w-garbage")
        _no_leftovers()
    finally:
        srv.stop()


async def test_cancellation_tells_backend_and_leaves_nothing(server):
    server.behaviour.delay_s = 2.0
    wf = Workflow("cancel")

    @wf.agent(system="Sync.")
    def blocking(ctx, state):  # runs in a worker thread, blocked on the LLM call
        return {"out": ctx.llm_sync("hello")}

    wf.add_agent("async_one", system="Async.", prompt="p")
    wf.add_node("fork", lambda s: None)
    wf.add_edge(START, "fork")
    wf.add_edge("fork", "blocking")
    wf.add_edge("fork", "async_one")
    task = asyncio.ensure_future(arun(wf, {}, backend=server.url, workflow_id="w-cancel"))
    # Wait until both calls reached the server (a fixed sleep flaked on a loaded machine), with a
    # deadline well inside the server's reply delay so they are still in flight when we cancel.
    deadline = time.monotonic() + 1.5
    while len(server.chats()) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(server.chats()) == 2  # both calls in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _done_sent(server, "w-cancel")
    _no_leftovers()


def test_max_steps_names_the_loop(server):
    wf = Workflow("spin")
    wf.add_agent("writer", system="W.", prompt="p", output="d")
    wf.add_node("judge", lambda s: None)
    wf.add_edge(START, "writer")
    wf.add_edge("writer", "judge")
    wf.add_conditional_edges("judge", lambda s: "again", {"again": "writer", "stop": END})
    with pytest.raises(WorkflowError,
                       match=r"exceeded max_steps=7.*loop that kept running: (writer -> judge|judge -> writer)"):
        run(wf, {}, backend=server.url, max_steps=7, workflow_id="w-spin")
    assert len(server.chats()) == 4
    assert _done_sent(server, "w-spin")


def _two_writers(key_b: str) -> Workflow:
    wf = Workflow("writes")
    wf.add_node("fork", lambda s: {"k": "fork"})

    async def writer_a(state):
        await asyncio.sleep(0.05)
        return {"k": "a"}

    async def writer_b(state):
        await asyncio.sleep(0.1)
        return {key_b: "b"}

    wf.add_node("writer_a", writer_a)
    wf.add_node("writer_b", writer_b)
    wf.add_node("after", lambda s: {"final": s["k"] + "!"})
    wf.add_edge(START, "fork")
    wf.add_edge("fork", "writer_a")
    wf.add_edge("fork", "writer_b")
    wf.add_edge(["writer_a", "writer_b"], "after")
    return wf


def test_concurrent_writes_without_reducer_name_both_nodes(server):
    with pytest.raises(WorkflowError, match=r"nodes 'writer_a' and 'writer_b' both wrote state key 'k'.*reducer"):
        run(_two_writers("k"), {}, backend=server.url)


def test_sequential_writes_are_last_write_wins(server):
    result = run(_two_writers("other"), {"k": "input"}, backend=server.url)
    # fork overwrote the input, writer_a overwrote fork (it started after fork ended)
    assert result.state == {"k": "a", "other": "b", "final": "a!"}


def test_reducer_declared_explicitly(server):
    wf = _two_writers("k")
    wf.reducers["k"] = lambda old, new: f"{old}+{new}"
    result = run(wf, {}, backend=server.url)
    assert result.state["k"] == "fork+a+b" and result.state["final"] == "fork+a+b!"


def test_bad_node_return_and_bad_inputs(server):
    wf = Workflow("bad")
    wf.add_node("n", lambda s: ["not", "a", "dict"])
    wf.add_edge(START, "n")
    with pytest.raises(WorkflowError, match=r"node 'n' returned list"):
        run(wf, {}, backend=server.url)
    with pytest.raises(WorkflowError, match="inputs must be a dict"):
        run(wf, ["x"], backend=server.url)
    with pytest.raises(WorkflowError, match="max_steps"):
        run(wf, {}, backend=server.url, max_steps=0)


def test_bad_workflow_id_or_namespace_fails_before_anything_runs(server):
    wf = chain(lambda s: END, ["b", END])
    with pytest.raises(WorkflowError, match="workflow_id is 300 characters long; the limit is 256"):
        run(wf, {}, backend=server.url, workflow_id="w" * 300)
    with pytest.raises(WorkflowError, match="namespace is 257 characters long"):
        run(wf, {}, backend=server.url, namespace="n" * 257)
    assert server.requests == []


def test_prompt_missing_state_key_names_node(server):
    wf = Workflow("tmpl")
    wf.add_agent("w", system="W.", prompt="about {topic}")
    wf.add_edge(START, "w")
    with pytest.raises(WorkflowError, match=r"prompt of node 'w' uses \{topic\}"):
        run(wf, {}, backend=server.url)


async def test_blocking_run_inside_a_loop_says_to_await(server):
    wf = chain(lambda s: END, ["b", END])
    with pytest.raises(WorkflowError, match=r"run\(\) was called inside a running event loop; use 'await arun"):
        run(wf, {}, backend=server.url)
    assert server.requests == []
