"""The learner's middleware for hosts whose OpenAI routes kvflow does not own (backends/learn/asgi.py),
over real HTTP on 127.0.0.1 (uvicorn) in front of a Starlette app standing in for the host's
routes: it answers as an OpenAI server does (JSON, or server-sent events when ``stream``), echoing
the ``custom_params`` it received. The real hosts (vLLM, SGLang) are tested in tests/vllm,
tests/frameworks and tests/sglang."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from backends.learn import TrafficLearner
from backends.learn.asgi import BODY_SCOPE_KEY, LearningMiddleware
from backends.learn.host import learned_hints_env, learner_from_env, reply_of_response
from kvflow_orch.protocol import KVFlowHint, StepsUpdate, attach_hint

SUPERVISOR = "You are the Supervisor. Pick the next worker or finish."
WRITER = "You are a Technical Writer. Write the report."


async def chat(request: Request) -> JSONResponse | StreamingResponse:
    body = await request.json()
    request.app.state.seen.append((body.get("custom_params"), request.scope.get(BODY_SCOPE_KEY) is not None))
    text = f"Reply number {len(request.app.state.seen)} with a line long enough to be carried on."
    if not body.get("stream"):
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})

    async def events() -> Iterator[bytes]:
        for piece in (text[:10], text[10:]):
            yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': piece}}]})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture
def host() -> Iterator[tuple[str, Starlette, TrafficLearner, list[StepsUpdate]]]:
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.state.seen = []
    learner, done = TrafficLearner(), []

    async def record(update: StepsUpdate) -> None:
        done.append(update)

    app.add_middleware(LearningMiddleware, learner=learner, done=record)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app, learner, done
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _post(url: str, body: dict | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30)


def test_plain_requests_reach_the_host_with_learned_hints_and_replies_link_the_session(host) -> None:
    url, app, learner, _ = host
    turns = [{"role": "user", "content": "Write a report on tides"}]
    for i, system in enumerate([SUPERVISOR, WRITER, SUPERVISOR]):
        r = _post(url, {"model": "m", "stream": i == 1, "messages": [{"role": "system", "content": system}, *turns]})
        assert r.status_code == 200
        reply = r.json()["choices"][0]["message"]["content"] if i != 1 else "".join(
            json.loads(line[5:])["choices"][0]["delta"]["content"] for line in r.text.splitlines()
            if line.startswith("data:") and "[DONE]" not in line)
        turns.append({"role": "assistant", "content": reply})
    hints = [KVFlowHint.model_validate(params["kvflow"]) for params, _ in app.state.seen]
    sid = hints[0].workflow_id  # the session's agents are named per session (session_agent)
    assert [h.agent for h in hints] == [f"{a}@{sid}" for a in ("supervisor", "technical-writer", "supervisor")]
    assert len({h.workflow_id for h in hints}) == 1 and hints[0].namespace == "learned"
    assert all(parsed for _, parsed in app.state.seen)  # the parsed body travels in the scope
    # another agent handed the streamed reply in its prompt joins the same session (the reply was read back)
    carried = {"model": "m", "messages": [{"role": "system", "content": WRITER},
                                          {"role": "user", "content": f"Edit this:\n{turns[2]['content']}"}]}
    assert _post(url, carried).status_code == 200
    assert app.state.seen[-1][0]["kvflow"]["workflow_id"] == hints[0].workflow_id
    assert learner.stats()["learned_hint_requests"] == 4


def test_declared_and_malformed_hints_and_non_json_pass_through_unchanged(host) -> None:
    url, app, learner, _ = host
    declared = KVFlowHint(workflow_id="wf-1", agent="planner", steps={"planner": 0})
    body = attach_hint({"model": "m", "custom_params": {"mine": 1},
                        "messages": [{"role": "system", "content": SUPERVISOR}, {"role": "user", "content": "x"}]},
                       declared)
    assert _post(url, body).status_code == 200
    assert app.state.seen[-1][0] == body["custom_params"]
    bad = {"model": "m", "messages": [{"role": "user", "content": "x"}],
           "custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}}
    assert _post(url, bad).status_code == 200  # the host's own validation answers it; here it echoes
    assert app.state.seen[-1][0] == bad["custom_params"]
    assert _post(url, b"{not json").status_code >= 400  # the host's JSON error, not the middleware's
    stats = learner.stats()
    assert (stats["declared_hint_requests"], stats["learned_hint_requests"]) == (1, 0)


def test_ended_sessions_reach_the_host_as_done_updates() -> None:
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    from backends.learn import LearnerConfig

    clock = Clock()
    learner, done = TrafficLearner(LearnerConfig(session_ttl_s=5), clock=clock), []

    async def record(update: StepsUpdate) -> None:
        done.append(update)

    async def app(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"choices": []}'})

    middleware = LearningMiddleware(app, learner, record)

    async def call(text: str) -> None:
        raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        messages = iter([{"type": "http.request", "body": raw, "more_body": False}])

        async def receive() -> dict:
            return next(messages)

        async def send(message: dict) -> None:
            pass

        await middleware({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []},
                         receive, send)

    asyncio.run(call("first task"))
    clock.now = 10
    asyncio.run(call("second task"))
    assert [(u.workflow_id, u.done) for u in done] == [("learned-1", True)]


def test_the_switch_and_reading_replies() -> None:
    assert learner_from_env({}) is None and learner_from_env(learned_hints_env(False)) is None
    assert isinstance(learner_from_env(learned_hints_env(True)), TrafficLearner)
    with pytest.raises(ValueError, match="KVFLOW_LEARNED_HINTS"):
        learner_from_env({"KVFLOW_LEARNED_HINTS": "maybe"})
    sse = b"".join(b"data: " + json.dumps({"choices": [{"index": 0, "delta": d}]}).encode() + b"\n\n" for d in [
        {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "search", "arguments": "{\"q\""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}]) + b"data: [DONE]\n\n"
    assert reply_of_response("chat", sse, True) == {
        "content": "", "tool_calls": [{"id": "call_1", "function": {"name": "search", "arguments": "{\"q\": 1}"}}]}
    assert reply_of_response("completions", b'{"choices": [{"index": 0, "text": "abc"}]}', False) == {"content": "abc"}
    assert reply_of_response("chat", b'{"error": {"message": "no"}}', False) is None
    assert reply_of_response("chat", b"not json", False) is None
