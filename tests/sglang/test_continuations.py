"""Continuations on SGLang 0.5.23's real UnifiedRadixCache (CPU): a session's request concludes at
its final checkpoint, a pause message keeps its conversation tagged with the continuation's ref,
other traffic is evicted first, the return finds it on device and counts reused; a stamped message
past the deadline untags it (recency untouched) and counts expired; a hint's ``resume_in_s`` keeps
it with no pause message; ``continuations: false`` keeps nothing. The HTTP side's middleware passes
the session key on and pauses the session when a reply calls tools."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from backends.kvcache.continuations import hold_for

pytestmark = pytest.mark.sglang

TOOL_S = 2.0  # tool_default_s: what a pause of a tool never observed is expected to last (its rank)
T0 = 1000.0
HOLD_S = hold_for(TOOL_S)  # tool_cold_hold_s here: how long such a pause is kept (30 s by default)
CONVERSATION = list(range(1, 21))  # 20 tokens: the agent's prompt (and what it produced)


def _session(key: str, sent_at: float) -> dict:
    return {"kvflow_session": {"key": key, "sent_at": sent_at}}


def _queued(rig, tokens: list[int], custom_params: dict | None):
    from backends.sglang_kvflow.tags import on_request_queued

    req = rig.make_req(tokens, custom_params)
    on_request_queued(SimpleNamespace(tree_cache=rig.cache), req)
    return req


def _pause(rig, key: str, tools: list[str], sent_at: float) -> None:
    from backends.sglang_kvflow.hints_bridge import KVFlowPauseReq, handle_pause

    handle_pause(SimpleNamespace(tree_cache=rig.cache), KVFlowPauseReq(namespace="default", key=key, tools=tools,
                                                                       sent_at=sent_at))


def _path_nodes(rig, tokens: list[int]) -> list:
    """The tree nodes along ``tokens`` (read-only walk)."""
    node, rest, out = rig.cache.tree_core.root_node, tokens, []
    while rest:
        child = next((c for c in node.children.values() if list(c.key.token_ids[:1]) == rest[:1]), None)
        if child is None:
            break
        out.append(child)
        node, rest = child, rest[len(child.key):]
    return out


def _continuation_tagged(node) -> bool:
    from backends.sglang_kvflow.tags import node_tags

    return any(agent.startswith("~continuation/") for _, agent in node_tags(node) or ())


def _rig(make_rig, **options):
    from backends.sglang_kvflow.state import get_state

    config = {"tool_default_s": TOOL_S, "tool_cold_hold_s": HOLD_S, **options}
    rig = make_rig(size=64, policy="kvflow", hicache=False, policy_config=config)
    return rig, get_state()  # the strategy configured the state from the policy config


def test_a_paused_session_outlives_other_traffic_and_its_return_reuses_it(make_rig):
    rig, state = _rig(make_rig)
    agent = _queued(rig, CONVERSATION, _session("agent", T0))
    rig.serve(agent)
    control = _queued(rig, [100 + t for t in CONVERSATION], _session("control", T0 + 0.1))  # never pauses
    rig.serve(control)
    assert state.counters["continuations_kept"] == 0  # a turn alone is not kept
    _pause(rig, "agent", ["search"], T0 + 0.2)
    assert state.counters["continuations_kept"] == 1 and state.snapshot()["continuations"] == 1
    assert all(_continuation_tagged(n) for n in _path_nodes(rig, CONVERSATION))
    for i in range(3):  # 3 x 20 untagged tokens through a 64-token pool while the tool runs
        rig.serve(_queued(rig, [200 + 20 * i + t for t in range(20)], None))
    assert rig.device_tokens(CONVERSATION) == len(CONVERSATION)  # kept: untagged traffic went first
    assert rig.device_tokens([100 + t for t in CONVERSATION]) == 0  # the control was evicted like LRU would
    back = _queued(rig, CONVERSATION + [50, 51, 52], _session("agent", T0 + 1.2))
    assert state.counters["continuations_reused"] == 1
    assert rig.device_tokens(list(back.origin_input_ids)) == len(CONVERSATION)  # its prefill starts after it
    rig.serve(back)
    assert state.snapshot()["continuations"] == 0  # returned: an ordinary prefix again
    assert not any(_continuation_tagged(n) for n in _path_nodes(rig, CONVERSATION))
    assert state.intake.continuations.durations.estimate("default", ["search"]).expected_s == pytest.approx(1.0)


def test_past_the_deadline_a_stamped_message_untags_it_and_leaves_its_recency(make_rig):
    rig, state = _rig(make_rig)
    rig.serve(_queued(rig, CONVERSATION, _session("agent", T0)))
    _pause(rig, "agent", ["slow"], T0)
    nodes = _path_nodes(rig, CONVERSATION)
    stamps = [n.last_access_time for n in nodes]
    _queued(rig, [300, 301], _session("other", T0 + HOLD_S - 0.1))  # before the deadline: still kept
    assert all(_continuation_tagged(n) for n in nodes)
    _queued(rig, [302, 303], _session("other", T0 + HOLD_S + 0.1))
    assert not any(_continuation_tagged(n) for n in nodes)
    assert [n.last_access_time for n in nodes] == stamps  # as evictable as it was before the pause
    assert state.counters["continuations_expired"] == 1 and state.snapshot()["continuations"] == 0


def test_a_hints_resume_in_s_keeps_the_conversation_without_a_pause_message(make_rig):
    rig, state = _rig(make_rig)
    hint = {"kvflow": {"workflow_id": "wf", "namespace": "ns", "agent": "coder", "steps": {"coder": 0},
                       "resume_in_s": 30}}
    rig.serve(_queued(rig, CONVERSATION, hint))
    assert state.counters["continuations_kept"] == 1
    assert all(_continuation_tagged(n) for n in _path_nodes(rig, CONVERSATION))


def test_with_continuations_off_nothing_is_kept(make_rig):
    rig, state = _rig(make_rig, continuations=False)
    rig.serve(_queued(rig, CONVERSATION, _session("agent", T0)))
    _pause(rig, "agent", ["search"], T0)
    assert state.counters["continuations_kept"] == 0
    assert not any(_continuation_tagged(n) for n in _path_nodes(rig, CONVERSATION))


def test_the_middleware_passes_the_session_on_and_pauses_it_when_the_reply_calls_tools(plugin):
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from backends.sglang_kvflow.routes import SessionMiddleware, with_session
    from kvflow_orch.protocol import HintError

    seen: list[dict] = []
    paused: list[tuple] = []

    async def chat(request):  # what the server answers: a reply that calls the tool it was offered
        body = await request.json()
        seen.append(body)
        calls = [{"id": "1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]
        message = {"role": "assistant", "tool_calls": calls if body.get("tools") else None}
        return JSONResponse({"choices": [{"message": message}]})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    async def record(session, tools) -> None:
        paused.append((session, tools))

    app.add_middleware(SessionMiddleware, pause=record)
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]

    async def go() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            codes = []
            for body in ({"messages": [], "user": "u-1", "tools": tools, "custom_params": {"mine": 1}},
                         {"messages": [], "prompt_cache_key": "k-1"},
                         {"messages": [], "user": 5}):
                codes.append((await client.post("/v1/chat/completions", json=body)).status_code)
            return codes

    assert asyncio.run(go()) == [200, 200, 400]
    assert seen[0]["custom_params"]["mine"] == 1 and seen[0]["custom_params"]["kvflow_session"]["key"] == "u-1"
    assert seen[1]["custom_params"]["kvflow_session"]["key"] == "k-1"
    assert paused == [(("default", "u-1"), ["search"])]  # the request without tools is not watched
    hinted = {"custom_params": {"kvflow": {"workflow_id": "w", "namespace": "ns", "agent": "a"}}}
    assert with_session(hinted, 1.0) == (None, ("ns", "w/a"))
    with pytest.raises(HintError, match="prompt_cache_key"):
        with_session({"prompt_cache_key": ""}, 1.0)
    assert json.loads(json.dumps(with_session({"user": "u"}, 2.0)[0])) == {
        "user": "u", "custom_params": {"kvflow_session": {"key": "u", "sent_at": 2.0}}}


def test_a_resident_return_goes_ahead_of_the_waiting_queue_with_the_wait_bounded(make_rig):
    from backends.kvcache.lifecycle import MAX_PASSED
    from backends.sglang_kvflow.admission import returns_first
    from backends.sglang_kvflow.tags import session_decision

    rig, state = _rig(make_rig)
    rig.serve(_queued(rig, CONVERSATION, _session("agent", T0)))
    _pause(rig, "agent", ["search"], T0)
    older = [_queued(rig, [400 + 10 * i + t for t in range(5)], None) for i in range(2)]
    back = _queued(rig, CONVERSATION + [60], _session("agent", T0 + 1))
    newer = _queued(rig, [500, 501], None)
    policy = SimpleNamespace(tree_cache=rig.cache)  # what calc_priority runs on
    queue = [*older, back, newer]
    returns_first(None, policy, queue)
    assert queue == [back, *older, newer] and state.counters["continuations_admitted_first"] == 1
    assert [getattr(r, "kvflow_passed", 0) for r in older] == [1, 1]
    older[0].kvflow_passed = MAX_PASSED  # passed over enough: arrival order again
    queue = [*older, back, newer]
    returns_first(None, policy, queue)
    assert queue == [*older, back, newer]
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    other = [800 + t for t in range(10)]
    rig.serve(_queued(rig, other, _session("agent2", T0 + 2)))
    _pause(rig, "agent2", ["search"], T0 + 2)
    rig.cache.evict(EvictParams(num_tokens=64))  # its KV is gone after all
    cold = _queued(rig, other + [1], _session("agent2", T0 + 3))
    assert session_decision(cold).resumes  # it returns in time, but to nothing resident
    queue = [newer, cold]
    returns_first(None, policy, queue)
    assert queue == [newer, cold]
