"""run()/arun()/run_many() against a real recording HTTP server: every call carries the agent and
the exact steps map the ASG semantics give at that moment (sequence, conditional loop, fan-out with
an AND-join, two concurrent workflows), out-of-band updates end with done, and the plain-server
fallback runs the same workflows without hints."""

from __future__ import annotations

import asyncio

import pytest
from runtime_graphs import FAN_HINTS, INF, LOOP_HINTS, by_workflow, fan_out_join, review_loop

from kvflow_orch import START, Workflow
from kvflow_orch.runtime import arun, run, run_many

def test_conditional_loop_hints_and_state(server):
    result = run(review_loop(), {"idea": "todo app"}, backend=server.url, workflow_id="wf-loop", namespace="app")
    assert result.workflow_id == "wf-loop"
    assert [(h["agent"], h["steps"]) for h in server.hints()] == LOOP_HINTS
    assert all(h["workflow_id"] == "wf-loop" and h["namespace"] == "app" and h["fixed_prefix"] == 1
               for h in server.hints())
    # the messages are [system (fixed), user (dynamic)]
    first = server.chats()[0]["messages"]
    assert first == [{"role": "system", "content": "You are a PM."}, {"role": "user", "content": "Idea: todo app"}]
    assert result.state["rounds"] == 2 and result.state["review"] == "reply to 5 words"
    assert [r.node for r in result.trace] == ["pm", "eng", "qa", "count", "eng", "qa", "count"]
    llm = [r for r in result.trace if r.agent]
    assert all(r.llm_calls == 1 and r.cached_tokens == 3 and r.completion_tokens == 4 for r in llm)
    assert all(r.start <= r.end for r in result.trace)
    assert [c.node for c in result.calls] == ["pm", "eng", "qa", "eng", "qa"]
    updates = server.steps_updates()
    assert updates[-1] == {"workflow_id": "wf-loop", "namespace": "app", "steps": {}, "done": True}
    # the plain node's start/finish and the router's choice were reported (coalesced) before done
    assert any(u["steps"] == {"pm": INF, "eng": 0, "qa": 1} for u in updates[:-1])


def test_fan_out_runs_concurrently_and_join_waits(server):
    server.behaviour.delay_s = 0.3
    result = run(fan_out_join(), {"topic": "caching"}, backend=server.url)
    got = [(h["agent"], h["steps"]) for h in server.hints()]
    assert got[0] == ("plan", FAN_HINTS["plan"]) and got[-1] == ("merge", FAN_HINTS["merge"])
    assert sorted(got[1:3]) == [("w1", FAN_HINTS["w1"]), ("w2", FAN_HINTS["w2"])]
    spans = {r.node: (r.start, r.end) for r in result.trace}
    assert spans["w1"][0] < spans["w2"][1] and spans["w2"][0] < spans["w1"][1], "workers did not overlap"
    assert spans["merge"][0] >= max(spans["collect_1"][1], spans["collect_2"][1])
    assert sorted(result.state["parts"]) == ["a", "b"]  # the reducer combined concurrent writes
    assert server.chats()[-1]["messages"][1]["content"] == "a + b"


def test_two_concurrent_workflows_are_attributed_separately(server):
    server.behaviour.delay_s = 0.05
    results = run_many(review_loop(), [{"idea": "one"}, {"idea": "two"}], backend=server.url, namespace="svc")
    ids = [r.workflow_id for r in results]
    assert len(set(ids)) == 2
    per_wf = by_workflow(server.hints())
    assert set(per_wf) == set(ids)
    for wid in ids:
        assert per_wf[wid] == LOOP_HINTS
    dones = [u["workflow_id"] for u in server.steps_updates() if u["done"]]
    assert sorted(dones) == sorted(ids)
    assert [r.state["prd"] for r in results] == ["reply to 2 words", "reply to 2 words"]
    # the two instances interleaved rather than running one after the other
    first_end = min(r.trace[-1].end for r in results)
    assert max(r.trace[0].start for r in results) < first_end


async def test_gathered_aruns_with_one_shared_client(server):
    from kvflow_orch.clients import HttpClient

    client = HttpClient(server.url)
    results = await asyncio.gather(*(arun(review_loop(1), {"idea": i}, backend=client) for i in "abc"))
    await client.aclose()
    assert len({r.workflow_id for r in results}) == 3
    assert all(seq == LOOP_HINTS[:3] for seq in by_workflow(server.hints()).values())


def test_fallback_plain_server_runs_without_hints(plain_server):
    with pytest.warns(RuntimeWarning, match="not a kvflow server"):
        result = run(review_loop(), {"idea": "todo app"}, backend=plain_server.url)
    with pytest.warns(RuntimeWarning):
        run(fan_out_join(), {"topic": "t"}, backend=plain_server.url)
    assert result.state["rounds"] == 2
    assert len(plain_server.chats()) == 5 + 4
    assert all(h is None for h in plain_server.hints())
    assert plain_server.steps_updates() == []
    assert all(c.hint is None for c in result.calls)


def test_custom_agents_async_and_sync(server):
    wf = Workflow("custom")

    @wf.agent(system="Async agent.", max_tokens=9)
    async def writer(ctx, state):
        assert ctx.node == "writer" and ctx.state["topic"] == state["topic"]
        first = await ctx.llm(f"draft about {state['topic']}")
        second = await ctx.llm("shorter please", max_tokens=3, stop=["\n"])
        return {"draft": first + " | " + second}

    @wf.agent(system="Sync agent.", agent="editor")
    def edit(ctx, state):
        return {"final": ctx.llm_sync("edit: " + state["draft"])}

    wf.add_edge(START, "writer")
    wf.add_edge("writer", "edit")
    result = run(wf, {"topic": "kv caches"}, backend=server.url)
    chats = server.chats()
    assert [c["max_tokens"] for c in chats] == [9, 3, 256]
    assert chats[1]["stop"] == ["\n"]
    assert [c["custom_params"]["kvflow"]["agent"] for c in chats] == ["writer", "writer", "editor"]
    assert chats[2]["custom_params"]["kvflow"]["steps"] == {"writer": None, "editor": 0}
    assert result.state["draft"] == "reply to 4 words | reply to 2 words"
    assert result.state["final"] == "reply to 10 words"
    assert [r.llm_calls for r in result.trace] == [2, 1]


def test_a_bare_stop_string_is_one_stop_sequence(server):
    # tuple("END") would have made three one-letter stops
    wf = Workflow("stops")
    wf.add_agent("template", system="T.", prompt="go", output="x", stop="END")

    @wf.agent(system="C.")
    async def custom(ctx, state):
        return {"y": await ctx.llm("go on", stop="\n\n")}

    wf.add_edge(START, "template")
    wf.add_edge("template", "custom")
    run(wf, {}, backend=server.url)
    assert [c["stop"] for c in server.chats()] == [["END"], ["\n\n"]]
