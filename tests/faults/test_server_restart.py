"""The server is killed mid-workflow (between two LLM calls, from a plain node of the workflow itself,
so the moment is deterministic). The runtime retries connection failures within its bounds:

* the server stays down -> the run fails with a WorkflowError naming the node whose call failed and
  the server's URL, after the bounded retries (quickly, not hanging);
* the server comes back (a fresh engine on the same port, as a restarted process would) inside the
  bounds -> the workflow completes, its later calls served by the new server, which is also told
  ``done``.
"""

from __future__ import annotations

import threading
import time

import pytest

from backends.server import create_app
from kvflow_live import ThreadServer, live_server, tiny_engine
from kvflow_orch import END, START, Workflow, arun
from kvflow_orch.clients import HttpClient, HttpConfig
from kvflow_orch.errors import WorkflowError


def two_step_workflow(on_checkpoint) -> Workflow:
    wf = Workflow("restart-drill")
    wf.add_agent("drafter", system="You draft a short plan for the goal you are given.", prompt="Goal: {goal}",
                 output="draft", max_tokens=4)
    wf.add_node("checkpoint", on_checkpoint)
    wf.add_agent("reviewer", system="You review a draft plan and list its flaws.", prompt="Draft: {draft}",
                 output="review", max_tokens=4)
    wf.add_edge(START, "drafter")
    wf.add_edge("drafter", "checkpoint")
    wf.add_edge("checkpoint", "reviewer")
    wf.add_edge("reviewer", END)
    return wf


async def test_server_killed_for_good_fails_with_node_and_url() -> None:
    with live_server(debug_routes=False) as live:
        def kill(state):
            live.server.kill()
            return {"killed": True}

        client = HttpClient(live.url, HttpConfig(retries=2, backoff_s=0.05, connect_timeout_s=1.0))
        started = time.monotonic()
        try:
            with pytest.raises(WorkflowError) as caught:
                await arun(two_step_workflow(kill), {"goal": "ship it"}, backend=client, workflow_id="wf-down")
        finally:
            await client.aclose()
        elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "'reviewer'" in message and live.url in message and "3 attempts" in message, message
    assert elapsed < 20, f"bounded retries should give up quickly, took {elapsed:.1f} s"


async def test_server_restarted_within_retry_bounds_completes_the_workflow() -> None:
    restarted_engine = tiny_engine()  # built up front: the restart itself must fit in the retry window
    with live_server(debug_routes=False) as live:
        successor = ThreadServer(create_app(restarted_engine), port=live.server.port)

        def kill_and_restart(state):
            live.server.kill()
            threading.Timer(0.5, successor.start).start()  # back while the runtime is still retrying
            return {"killed": True}

        # backoff 0.1, 0.2, 0.4, ... : about 25 s of retries in all, far more than the restart needs
        client = HttpClient(live.url, HttpConfig(retries=8, backoff_s=0.1, connect_timeout_s=1.0))
        try:
            result = await arun(two_step_workflow(kill_and_restart), {"goal": "ship it"}, backend=client,
                                workflow_id="wf-restart")
        finally:
            await client.aclose()
            successor.kill()
    assert result.state["killed"] and isinstance(result.state["review"], str)
    assert [c.node for c in result.calls] == ["drafter", "reviewer"]
    stats = restarted_engine.stats()
    # the reviewer's call (and nothing before it) reached the restarted server
    assert stats["recomputed_tokens"] == result.calls[1].prompt_tokens - result.calls[1].cached_tokens
    assert stats["workflows"] == 0  # it was told done
