"""Continuations on the vLLM plugin without a server: the engine-side state calls the brain's verbs
(accept with the session key, conclude at a request's end, pause after tool calls, expire), tags
the kept conversation's block hashes and drops them at the deadline; the API side finds the session
key and the tools a reply calls; on vLLM's real BlockPool an expired conversation's free blocks go
to the head of the free queue. The live round trip is tests/vllm/test_live_server.py's."""

from __future__ import annotations

import asyncio
import json

import pytest

from backends.kvcache.config import CacheConfig
from backends.kvcache.continuations import DEADLINE_SLACK, hold_for
from backends.pause_watch import ToolCallWatch, session_key
from backends.vllm_kvflow.routes import _HintMiddleware, pause_session, rewrite_body
from backends.vllm_kvflow.state import HINT_KEY, SESSION_KEY, KVFlowState, read_session
from kvflow_orch.protocol import HintError, KVFlowHint
from vllm_server import HAVE_VLLM, SKIP_REASON

BS = 4
TOOL_S = 2.0  # tool_default_s: what a pause of a tool never observed is expected to last (its rank)
HOLD_S = hold_for(TOOL_S)  # tool_cold_hold_s here: how long such a pause is kept (30 s by default)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _state(**options) -> tuple[KVFlowState, Clock]:
    clock = Clock()
    config = CacheConfig(device_tokens=256, tool_default_s=TOOL_S, tool_cold_hold_s=HOLD_S, namespace_cap_tokens=10**6,
                         **options)
    return KVFlowState(config, BS, clock=clock), clock


def _hashes(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i}" for i in range(n)]


def _turn(state: KVFlowState, key: str | None, hashes: list[str], hint: KVFlowHint | None = None):
    """One request of session ``key``: accepted, then concluded with ``hashes`` cached."""
    params = {**({SESSION_KEY: key} if key else {}), **({HINT_KEY: hint.model_dump(mode="json")} if hint else {})}
    decision = state.accept(params, list(range(len(hashes) * BS)), hashes)
    state.conclude(decision, hashes)
    return decision


def _continuation_tagged(state: KVFlowState, h: str) -> bool:
    return any(agent.startswith("~continuation/") for _, agent in state.tags.get(h) or ())


def test_a_plain_session_paused_by_tool_calls_is_kept_reused_then_dropped() -> None:
    state, clock = _state()
    first = _turn(state, "sess-1", _hashes("c", 3))
    assert first.session == ("default", "sess-1") and not first.resumes
    assert not state.tags  # a turn alone is not kept: nothing says the agent pauses
    assert state.pause(first.session, ["search"])
    assert all(_continuation_tagged(state, h) for h in _hashes("c", 3))
    snap = state.snapshot()
    assert (snap["continuations_kept"], snap["continuations"]) == (1, 1)
    # the kept conversation outranks untagged blocks: evicted last
    assert state.order([("c-0", "c"), ("x-0", "x")]) == ["x", "c"]
    clock.now += 1.0  # the tool ran for a second; the agent returns with the longer conversation
    back = _turn(state, "sess-1", _hashes("c", 3) + ["d-0"])
    assert back.resumes
    snap = state.snapshot()
    assert (snap["continuations_reused"], snap["continuations"]) == (1, 0)
    assert not any(_continuation_tagged(state, h) for h in _hashes("c", 3))  # returned: an ordinary prefix again
    assert state.intake.continuations.durations.estimate("default", ["search"]).expected_s == pytest.approx(1.0)


def test_past_its_deadline_a_conversation_loses_its_tags_and_counts_expired() -> None:
    state, clock = _state()
    decision = _turn(state, "sess-2", _hashes("e", 2))
    state.pause(decision.session, ["slow_tool"])
    clock.now += HOLD_S - 0.1
    assert state.expire() and _continuation_tagged(state, "e-0")
    clock.now += 0.2
    state.expire()
    assert not state.tags and state.snapshot()["continuations_expired"] == 1
    assert state.take_loose() == ["e-0", "e-1"] and state.take_loose() == []  # for the scheduler, once
    late = _turn(state, "sess-2", _hashes("e", 3))
    assert not late.resumes and state.snapshot()["continuations_reused"] == 0
    # the late return taught the tool's duration all the same: the next deadline is longer
    assert state.intake.continuations.durations.estimate("default", ["slow_tool"]).hold_s > HOLD_S


def test_a_hints_resume_in_s_keeps_the_conversation_when_the_request_ends() -> None:
    state, clock = _state()
    hint = KVFlowHint(workflow_id="wf", agent="coder", steps={"coder": 0}, resume_in_s=30)
    decision = _turn(state, None, _hashes("h", 2), hint)
    assert decision.session == ("default", "wf/coder") and decision.resume_in_s == 30
    assert _continuation_tagged(state, "h-0") and state.snapshot()["continuations_kept"] == 1
    clock.now += 30 * DEADLINE_SLACK  # still within the announced pause's deadline
    state.expire()
    assert _continuation_tagged(state, "h-0")


def test_with_continuations_off_or_without_a_session_nothing_is_kept() -> None:
    state, _ = _state(continuations=False)
    decision = _turn(state, "sess-3", _hashes("o", 2))
    assert not state.pause(decision.session, ["search"]) and not state.tags
    state, _ = _state()
    assert _turn(state, None, _hashes("n", 2)).session is None
    assert state.snapshot()["continuations_kept"] == 0


def test_the_session_key_reaches_the_scheduler_checked() -> None:
    assert read_session({SESSION_KEY: "abc"}) == "abc"
    assert read_session({SESSION_KEY: ""}) is None and read_session({SESSION_KEY: 3}) is None
    assert read_session(None) is None
    body = {"model": "m", "messages": [{"role": "user", "content": "u"}], "user": "u-1"}
    out = rewrite_body(body, "/v1/chat/completions", None)
    assert out["kv_transfer_params"] == {SESSION_KEY: "u-1"} and out["user"] == "u-1"
    out = rewrite_body({**body, "prompt_cache_key": "pck"}, "/v1/chat/completions", None)
    assert out["kv_transfer_params"][SESSION_KEY] == "pck"  # OpenAI's cache key wins over user
    for bad in ({"user": 7}, {"prompt_cache_key": ""}, {"user": "x" * 10_000}):
        with pytest.raises(HintError, match=next(iter(bad))):
            session_key(bad)


def test_only_a_chat_request_that_offers_tools_and_has_a_session_is_watched() -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "u"}], "tools": tools, "user": "u-1"}
    out = rewrite_body(body, "/v1/chat/completions", None)
    assert pause_session(out, "/v1/chat/completions") == ("default", "u-1")
    assert pause_session({**out, "tools": []}, "/v1/chat/completions") is None
    assert pause_session(out, "/v1/completions") is None
    hint = KVFlowHint(workflow_id="wf", namespace="ns", agent="a")
    hinted = rewrite_body({**body, "kv_transfer_params": {"kvflow": hint.model_dump(mode="json")}},
                          "/v1/chat/completions", None)
    assert pause_session(hinted, "/v1/chat/completions") == ("ns", "wf/a")  # the hint's agent, as the scheduler


def test_the_tools_a_reply_calls_are_read_from_json_and_from_a_stream_split_anywhere() -> None:
    reply = {"choices": [{"message": {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        {"id": "2", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]}}]}
    watch = ToolCallWatch(streaming=False)
    raw = json.dumps(reply).encode()
    watch.feed(raw[:10])
    watch.feed(raw[10:])
    assert watch.finish() == ["search", "fetch"]
    events = [{"choices": [{"delta": {"role": "assistant"}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "search", "arguments": ""}}]}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\": 1}"}}]}}]}]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    watch = ToolCallWatch(streaming=True)
    for i in range(0, len(stream), 7):
        watch.feed(stream[i:i + 7])
    assert watch.finish() == ["search"]
    plain = ToolCallWatch(streaming=False)
    plain.feed(json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode())
    assert plain.finish() == []
    broken = ToolCallWatch(streaming=False)
    broken.feed(b"{not json")
    assert broken.finish() == []


RESPONSE = {"id": "resp_1", "object": "response", "status": "completed", "output": [
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search", "arguments": "{\"q\": 1}"},
    {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}]}


def test_the_function_calls_of_a_response_are_read_from_json_and_from_its_events_once() -> None:
    watch = ToolCallWatch(streaming=False)
    raw = json.dumps(RESPONSE).encode()
    watch.feed(raw[:9])
    watch.feed(raw[9:])
    assert watch.finish() == ["search"]
    call = RESPONSE["output"][1]
    events = [("response.created", {"response": {**RESPONSE, "status": "in_progress", "output": []}}),
              ("response.output_item.added", {"item": {**call, "arguments": ""}, "output_index": 0}),
              ("response.function_call_arguments.delta", {"delta": "{\"q\"", "item_id": "fc_1"}),
              ("response.output_item.done", {"item": call, "output_index": 0}),
              ("response.completed", {"response": RESPONSE})]  # its items were announced: not twice
    stream = b"".join(f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}).encode() + b"\n\n"
                      for kind, data in events)
    watch = ToolCallWatch(streaming=True)
    for i in range(0, len(stream), 11):
        watch.feed(stream[i:i + 11])
    assert watch.finish() == ["search"]
    text_only = {**RESPONSE, "output": [RESPONSE["output"][2]]}
    plain = ToolCallWatch(streaming=False)
    plain.feed(json.dumps(text_only).encode())
    assert plain.finish() == []
    odd = ToolCallWatch(streaming=False)  # malformed items are skipped, never raised on
    odd.feed(json.dumps({"output": [None, {"type": "function_call", "name": 3}], "choices": "x"}).encode())
    assert odd.finish() == []


def test_a_responses_request_that_offers_tools_and_has_a_session_is_watched() -> None:
    tools = [{"type": "function", "name": "search", "parameters": {"type": "object"}}]
    body = {"model": "m", "input": "When is the release?", "tools": tools, "prompt_cache_key": "r-1"}
    out = rewrite_body(body, "/v1/responses", None)
    assert out["kv_transfer_params"] == {SESSION_KEY: "r-1"}
    assert pause_session(out, "/v1/responses") == ("default", "r-1")
    assert pause_session({**out, "tools": []}, "/v1/responses") is None


def test_the_hint_middleware_pauses_a_session_before_a_response_with_a_function_call_reaches_the_agent() -> None:
    """The plugin's middleware around an ASGI app that answers ``/v1/responses`` as vLLM does (a
    function_call item): the pause is awaited before the reply's last bytes are sent, and the app
    got the session key where vLLM's scheduler reads it."""
    seen: list[dict] = []
    order: list[str] = []

    async def app(scope: dict, receive, send) -> None:
        message = await receive()
        seen.append(json.loads(message["body"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(RESPONSE).encode()})

    async def pause(session, tools) -> None:
        order.append(f"pause {session[1]} {','.join(tools)}")

    async def client(body: dict) -> None:
        raw = json.dumps(body).encode()

        async def receive() -> dict:
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                order.append("reply")

        scope = {"type": "http", "method": "POST", "path": "/v1/responses",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]}
        await _HintMiddleware(app, tokenizer_of=lambda: None, pause=pause)(scope, receive, send)

    tools = [{"type": "function", "name": "search", "parameters": {"type": "object"}}]
    asyncio.run(client({"model": "m", "input": "q", "tools": tools, "user": "agent-7"}))
    assert order == ["pause agent-7 search", "reply"]
    assert seen[0]["kv_transfer_params"] == {SESSION_KEY: "agent-7"}
    order.clear()
    asyncio.run(client({"model": "m", "input": "q", "user": "agent-7"}))  # no tools offered: not watched
    assert order == ["reply"]


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)
def test_on_vllms_block_pool_an_expired_conversation_goes_to_the_head_of_the_free_queue() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from backends.vllm_kvflow.scheduler import _pause_payload, install_pool_hooks, reorder_free_queue

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BS, sha256)
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=BS)
    state, clock = _state()
    install_pool_hooks(pool, state, lambda: reorder_free_queue(pool, state))

    def run(rid: str, tokens: list[int], key: str | None = None):
        req = Request(rid, tokens, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        decision = state.accept({SESSION_KEY: key} if key else None, req.prompt_token_ids, req.block_hashes)
        n = len(tokens) // BS
        blocks = pool.get_new_blocks(n)
        pool.cache_full_blocks(req, blocks, 0, n, BS, 0)
        state.conclude(decision, req.block_hashes)
        pool.free_blocks(reversed(blocks))
        return decision, blocks

    decision, kept = run("agent", list(range(8)), key="s")
    _, other = run("other", list(range(100, 108)))
    assert state.pause(decision.session, ["search"]) and reorder_free_queue(pool, state) == 2
    queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert queue[-2:] == sorted((b.block_id for b in kept), key=queue.index)  # kept: evicted last
    clock.now += HOLD_S + 1
    state.expire()
    reorder_free_queue(pool, state)
    queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert set(queue[:2]) == {b.block_id for b in kept}  # expired: evicted first, before the other's
    assert queue.index(other[0].block_id) > 1
    assert _pause_payload({"session": ["default", "s"], "tools": ["t"]}) == (("default", "s"), ["t"], None)
    for bad, message in (({"session": "s"}, "session"), ({"session": ["a", "b"], "tools": "t"}, "tools"),
                         ({"session": ["a", "b"], "resume_in_s": -1}, "resume_in_s"), ([], "object")):
        with pytest.raises(ValueError, match=message):
            _pause_payload(bad)


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)
def test_vllms_scheduler_keeps_a_paused_conversation_and_admits_its_resident_return_first(tmp_path) -> None:
    """The real KVFlowScheduler on vLLM's KVCacheManager (the eviction spec's adapter builds it): a
    session's request ends, the ``pause`` verb keeps it, untagged traffic through the 8-block pool
    leaves it cached, and its return goes ahead of a request that arrived before it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
    from eviction_spec import BLOCK, Setup
    from eviction_vllm import VLLMHost
    from vllm.v1.outputs import ModelRunnerOutput

    host = VLLMHost(tmp_path).open(Setup(device_tokens=8 * BLOCK, namespace_cap_tokens=None, host_tokens=0))
    scheduler = host.scheduler

    def finish(*reqs) -> None:
        out = scheduler.schedule()
        assert all(r.request_id in out.num_scheduled_tokens for r in reqs)
        ids = [r.request_id for r in reqs]
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=[[0]] * len(ids),
            logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        assert not scheduler.requests

    def submit(tokens: list[int], key: str | None = None):
        req = host._request(tokens, {SESSION_KEY: key} if key else None)
        scheduler.add_request(req)
        return req

    conversation = list(range(1, 3 * BLOCK + 1))
    finish(submit(conversation, "agent"))
    assert scheduler.kvflow_call("pause", {"session": ["default", "agent"], "tools": ["search"]}) == {
        "ok": True, "kept": True}
    for i in range(3):  # 9 untagged blocks through the 8-block pool
        finish(submit([1000 * (i + 1) + t for t in range(3 * BLOCK)]))
    stats = scheduler.kvflow_call("stats")
    assert stats["evicted_device_tokens"] > 0 and stats["continuations_kept"] == 1 and stats["continuations"] == 1
    assert host.held(conversation, any_tier=False) == len(conversation)  # kept: the untagged went first
    older = submit([9000 + t for t in range(2 * BLOCK)])
    back = submit(conversation + [7] * 5, "agent")
    assert list(scheduler.waiting) == [back, older]  # the resident return is admitted first
    finish(back, older)
    stats = scheduler.kvflow_call("stats")
    assert (stats["continuations_reused"], stats["continuations_admitted_first"], stats["continuations"]) == (1, 1, 0)
    with pytest.raises(ValueError, match="session"):
        scheduler.kvflow_call("pause", {"session": None})


def test_a_stock_scheduler_ignores_pauses_as_it_ignores_steps() -> None:
    from types import SimpleNamespace

    from backends.vllm_kvflow.plugin import engine_kvflow_call

    core = SimpleNamespace(scheduler=SimpleNamespace())  # vLLM's own Scheduler: no kvflow_call
    reply = engine_kvflow_call(core, "pause", {"session": ["default", "s"], "tools": ["t"]})
    assert reply["ok"] and "not loaded" in reply["ignored"]
    with pytest.raises(ValueError, match="pause"):
        engine_kvflow_call(core, "nope")
