"""The HTTP client against a real server on 127.0.0.1: probing, hint placement, the plain-server
fallback, retries, errors naming the URL, garbage replies, coalesced steps updates."""

from __future__ import annotations

import asyncio
import time

import pytest
from recording_server import Behaviour, RecordingServer

from kvflow_orch.clients import BackendError, HttpClient, HttpConfig, open_client
from kvflow_orch.protocol import Sampling
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "say hi now"}]
HINT = KVFlowHint(workflow_id="w1", namespace="ns", agent="pm", steps={"pm": 0, "qa": None}, fixed_prefix=1)


async def test_kvflow_server_gets_hint_and_usage_is_parsed(server):
    client = HttpClient(server.url)
    reply = await client.chat(MESSAGES, Sampling(max_tokens=7), HINT)
    await client.aclose()
    assert client.supports_hints
    assert reply.text == "reply to 3 words"
    assert (reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens) == (6, 4, 3)
    (body,) = server.chats()
    assert body["custom_params"]["kvflow"] == HINT.model_dump(mode="json")
    assert body["model"] == "recorder"  # taken from /kvflow/v1/info
    assert body["max_tokens"] == 7 and body["messages"] == MESSAGES
    # probed exactly once, before the call
    assert [r.path for r in server.requests] == ["/kvflow/v1/info", "/v1/chat/completions"]


async def test_ignore_eos_reaches_the_server_only_when_asked(server):
    client = HttpClient(server.url)
    await client.chat(MESSAGES, Sampling(max_tokens=5, ignore_eos=True), HINT)
    await client.chat(MESSAGES, Sampling(max_tokens=5), HINT)
    await client.aclose()
    asked, default = server.chats()
    assert asked["ignore_eos"] is True
    assert "ignore_eos" not in default  # plain OpenAI servers may reject the extension


async def test_plain_server_gets_no_hint_and_warns_once(plain_server):
    client = HttpClient(plain_server.url)
    with pytest.warns(RuntimeWarning, match="no /kvflow/v1/info") as caught:
        await client.chat(MESSAGES, Sampling(), HINT)
        await client.chat(MESSAGES, Sampling(), HINT)
    client.send_steps(StepsUpdate(workflow_id="w1", steps={"pm": 1}))
    await client.aclose()
    assert len([w for w in caught if "kvflow" in str(w.message)]) == 1
    assert not client.supports_hints
    assert all("custom_params" not in c for c in plain_server.chats())
    assert plain_server.chats()[0]["model"] == "recorder-model"  # from /v1/models
    assert plain_server.steps_updates() == []


async def test_connection_refused_is_retried_then_names_the_url(dead_url):
    client = HttpClient(dead_url, HttpConfig(retries=2, backoff_s=0.01))
    started = time.monotonic()
    with pytest.raises(BackendError, match=f"failed after 3 attempts.*{dead_url}"):
        await client.chat(MESSAGES, Sampling(), HINT)
    assert time.monotonic() - started < 5
    await client.aclose()


async def test_garbage_reply_is_a_clear_error():
    srv = RecordingServer(Behaviour(garbage=True)).start()
    try:
        client = HttpClient(srv.url)
        with pytest.raises(BackendError, match=r"not a chat completion.*not json.*" + srv.url):
            await client.chat(MESSAGES, Sampling(), HINT)
        await client.aclose()
    finally:
        srv.stop()


async def test_http_error_status_names_status_and_message():
    srv = RecordingServer(Behaviour(fail_status=400)).start()
    try:
        client = HttpClient(srv.url)
        with pytest.raises(BackendError, match="HTTP 400: recorder told to fail"):
            await client.chat(MESSAGES, Sampling(), HINT)
        await client.aclose()
        assert len(srv.chats()) == 1  # 4xx is not retried
    finally:
        srv.stop()


async def test_unavailable_is_retried_with_backoff():
    srv = RecordingServer(Behaviour(fail_status=503)).start()
    try:
        client = HttpClient(srv.url, HttpConfig(retries=2, backoff_s=0.01))
        with pytest.raises(BackendError, match="HTTP 503"):
            await client.chat(MESSAGES, Sampling(), HINT)
        await client.aclose()
        assert len(srv.chats()) == 3
    finally:
        srv.stop()


async def test_read_timeout_is_not_retried(server):
    server.behaviour.delay_s = 0.5
    client = HttpClient(server.url, HttpConfig(retries=2, backoff_s=0.01, read_timeout_s=0.2))
    with pytest.raises(BackendError, match=f"ReadTimeout.*{server.url}"):
        await client.chat(MESSAGES, Sampling(), HINT)
    await client.aclose()
    assert len(server.chats()) == 1  # the server already had the request


async def test_steps_updates_are_coalesced_and_done_is_final(server):
    client = HttpClient(server.url)
    await client.chat(MESSAGES, Sampling(), HINT)  # probe
    server.behaviour.delay_s = 0.0
    for i in range(50):
        client.send_steps(StepsUpdate(workflow_id="w1", namespace="ns", steps={"pm": i}))
    client.send_steps(StepsUpdate(workflow_id="w1", namespace="ns", steps={}, done=True))
    client.send_steps(StepsUpdate(workflow_id="w1", namespace="ns", steps={"pm": 99}))
    await client.aclose()
    updates = server.steps_updates()
    assert 1 <= len(updates) < 10, updates  # a burst costs a few requests, not 52
    assert updates[-1]["done"] is True
    assert all(u["steps"].get("pm") != 99 for u in updates)


async def test_a_workflow_that_ends_before_the_server_heard_of_it_costs_no_request(server):
    client = HttpClient(server.url)
    await client.chat(MESSAGES, Sampling(), HINT)  # the server hears of HINT's workflow only
    client.send_steps(StepsUpdate(workflow_id="quiet", namespace="ns", steps={"pm": 1}))
    client.send_steps(StepsUpdate(workflow_id="quiet", namespace="ns", steps={}, done=True))
    client.send_steps(StepsUpdate(workflow_id="w1", namespace="ns", steps={}, done=True))
    await client.aclose()
    assert server.steps_updates() == [{"workflow_id": "w1", "namespace": "ns", "steps": {}, "done": True}]


async def test_a_done_follows_a_delivered_update_of_a_workflow_that_made_no_call(server):
    client = HttpClient(server.url)
    await client.chat(MESSAGES, Sampling(), HINT)
    client.send_steps(StepsUpdate(workflow_id="tools", namespace="ns", steps={"pm": 1}))
    await client.flush()  # delivered: now the server knows the workflow
    client.send_steps(StepsUpdate(workflow_id="tools", namespace="ns", steps={}, done=True))
    await client.aclose()
    assert [(u["workflow_id"], u["done"]) for u in server.steps_updates()] == [("tools", False), ("tools", True)]


async def test_steps_before_first_call_are_held_until_probe(server):
    client = HttpClient(server.url)
    client.send_steps(StepsUpdate(workflow_id="w9", steps={"a": 0}))
    await asyncio.sleep(0.05)
    assert server.requests == []  # nothing sent before we know the server speaks kvflow
    await client.aclose()
    assert server.steps_updates() == [{"workflow_id": "w9", "namespace": "default", "steps": {"a": 0}, "done": False}]


async def test_held_steps_of_namesake_workflows_in_two_namespaces_both_arrive(server):
    client = HttpClient(server.url)
    client.send_steps(StepsUpdate(workflow_id="w9", namespace="tenant-a", steps={"a": 0}))
    client.send_steps(StepsUpdate(workflow_id="w9", namespace="tenant-b", steps={"a": 1}))
    await client.aclose()
    sent = sorted((u["namespace"], u["steps"]["a"]) for u in server.steps_updates())
    assert sent == [("tenant-a", 0), ("tenant-b", 1)]


def test_one_client_serves_blocking_runs_each_on_its_own_event_loop(server):
    from kvflow_orch import START, Workflow
    from kvflow_orch.runtime import run

    wf = Workflow("twice")
    wf.add_agent("a", system="S.", prompt="p", output="x")
    wf.add_edge(START, "a")
    client = HttpClient(server.url)
    first = run(wf, {}, backend=client)
    second = run(wf, {}, backend=client)  # asyncio.run again: the first loop's connections are gone
    assert first.state == second.state == {"x": "reply to 1 words"}
    assert [h["workflow_id"] for h in server.hints()] == [first.workflow_id, second.workflow_id]
    asyncio.run(client.aclose())


def test_open_client_forms(server):
    opened = open_client(server.url)
    assert isinstance(opened.client, HttpClient) and opened.owned
    again = open_client(opened.client)
    assert again.client is opened.client and not again.owned
    with pytest.raises(ValueError, match="not understood"):
        open_client("ftp://x")
    with pytest.raises(ValueError, match="http:// or https://"):
        HttpClient("localhost:8000")
    asyncio.run(opened.client.aclose())
