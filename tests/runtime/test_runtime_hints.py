"""run()/arun()/run_many() against a real recording HTTP server: every call carries the agent and
the exact steps map the ASG semantics give at that moment (sequence, conditional loop, fan-out with
an AND-join, two concurrent workflows), out-of-band updates end with done, and the plain-server
fallback runs the same workflows without hints.

Expected steps are derived by hand from issue 2's equations for each small graph."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

import pytest

from kvflow_orch import END, START, Workflow
from kvflow_orch.runtime import arun, run, run_many

INF = None  # wire form of "not expected again"


def review_loop(rounds: int = 2) -> Workflow:
    """pm -> eng -> qa -> count (plain) -> {eng | END}; count decides after `rounds` reviews."""
    wf = Workflow("loop")
    wf.add_agent("pm", system="You are a PM.", prompt="Idea: {idea}", output="prd")
    wf.add_agent("eng", system="You are an engineer.", prompt="PRD: {prd}", output="code")
    wf.add_agent("qa", system="You are QA.", prompt="Code: {code}", output="review")
    wf.add_node("count", lambda s: {"rounds": s.get("rounds", 0) + 1})
    wf.add_edge(START, "pm")
    wf.add_edge("pm", "eng")
    wf.add_edge("eng", "qa")
    wf.add_edge("qa", "count")
    wf.add_conditional_edges("count", lambda s: "fix" if s["rounds"] < rounds else "ship", {"fix": "eng", "ship": END})
    return wf


# While pm runs: eng 1, qa 2. While eng runs: qa 1, and eng itself 0; pm can never run again.
# While qa runs: count 1, so eng (via the router) 2.
LOOP_HINTS = [
    ("pm", {"pm": 0, "eng": 1, "qa": 2}),
    ("eng", {"pm": INF, "eng": 0, "qa": 1}),
    ("qa", {"pm": INF, "eng": 2, "qa": 0}),
    ("eng", {"pm": INF, "eng": 0, "qa": 1}),
    ("qa", {"pm": INF, "eng": 2, "qa": 0}),
]


class FanState(TypedDict, total=False):
    topic: str
    parts: Annotated[list, operator.add]
    summary: str


def fan_out_join() -> Workflow:
    """plan -> {w1, w2} concurrently -> AND-join -> merge."""
    wf = Workflow("fan", state=FanState)
    wf.add_agent("plan", system="Plan.", prompt="{topic}", output="plan")
    for w in ("w1", "w2"):
        wf.add_agent(w, system=f"Worker {w}.", prompt=lambda s, w=w: f"{w} works on {s['plan']}")
        wf.add_edge("plan", w)
    wf.add_node("collect_1", lambda s: {"parts": ["a"]})
    wf.add_node("collect_2", lambda s: {"parts": ["b"]})
    wf.add_edge("w1", "collect_1")
    wf.add_edge("w2", "collect_2")
    wf.add_edge(["collect_1", "collect_2"], "merge")
    wf.add_agent("merge", system="Merge.", prompt=lambda s: " + ".join(sorted(s["parts"])), output="summary")
    wf.add_edge(START, "plan")
    return wf


FAN_HINTS = {
    # plan running: workers 1 away, merge 1 + max(collect_1, collect_2) = 1 + 2
    "plan": {"plan": 0, "w1": 1, "w2": 1, "merge": 3},
    # both workers running (they start together): merge waits for collect_* (1 each) -> 2
    "w1": {"plan": INF, "w1": 0, "w2": 0, "merge": 2},
    "w2": {"plan": INF, "w1": 0, "w2": 0, "merge": 2},
    "merge": {"plan": INF, "w1": INF, "w2": INF, "merge": 0},
}


def _by_workflow(server) -> dict[str, list[tuple[str, dict]]]:
    out: dict[str, list[tuple[str, dict]]] = {}
    for hint in server.hints():
        out.setdefault(hint["workflow_id"], []).append((hint["agent"], hint["steps"]))
    return out


def test_conditional_loop_hints_and_state(server):
    result = run(review_loop(), {"idea": "todo app"}, backend=server.url, workflow_id="wf-loop", namespace="app")
    assert result.workflow_id == "wf-loop"
    assert [(h["agent"], h["steps"]) for h in server.hints()] == LOOP_HINTS
    assert all(h["workflow_id"] == "wf-loop" and h["namespace"] == "app" and h["fixed_prefix"] == 1 for h in server.hints())
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
    per_wf = _by_workflow(server)
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
    assert all(seq == LOOP_HINTS[:3] for seq in _by_workflow(server).values())


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
