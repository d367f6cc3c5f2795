"""Learned hints on SGLang: with ``KVFLOW_LEARNED_HINTS=on``, ``install_routes`` puts the traffic
learner in front of SGLang's own ``/v1/chat/completions`` endpoint (its real request model and
validation), so plain OpenAI requests reach SGLang's serving layer carrying the learned hint in
``custom_params.kvflow``; the plugin's real tokenizer-manager hook flattens it and the real
scheduler-side reader and queue hook apply it to the hint table. The learner's counts join
``/kvflow/v1/stats`` (summed over SGLang's real stats fan-out) and ``/kvflow/v1/learned`` lists the
agents. SGLang's ``OpenAIServingChat`` is replaced by a recorder: it needs a model process (a GPU)."""

from __future__ import annotations

from typing import Any

import pytest

from test_hint_api import server  # noqa: F401 (the fixture: SGLang's managers, scheduler and stats link)

pytestmark = pytest.mark.sglang

SUPERVISOR = "You are the Supervisor. Route each task to the right worker."
ANALYST = "You are a Research Analyst. Find the facts."


class ServingChatRecorder:
    """Where SGLang's OpenAIServingChat would turn the request into a GenerateReqInput: this one
    builds it from the request's ``custom_params`` as SGLang does, runs the plugin's real BEFORE
    hook on it, keeps what the scheduler would get, and answers as an OpenAI server does."""

    def __init__(self) -> None:
        self.flat: list[dict[str, Any]] = []

    async def handle_request(self, request: Any, raw_request: Any) -> dict[str, Any]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        from backends.sglang_kvflow.hints_bridge import validate_generate_request

        obj = GenerateReqInput(text="prompt", sampling_params={"custom_params": request.custom_params})
        validate_generate_request(None, obj)
        self.flat.append(obj.sampling_params["custom_params"])
        text = f"Answer {len(self.flat)} to {request.messages[-1].content[:40]}, written out on one line."
        return {"id": "x", "object": "chat.completion", "model": request.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


@pytest.fixture
def learned_app(server):  # noqa: F811
    from fastapi import Depends, FastAPI
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server

    from backends.sglang_kvflow import routes

    app = FastAPI()
    app.add_api_route("/v1/chat/completions", http_server.openai_v1_chat_completions, methods=["POST"],
                      dependencies=[Depends(http_server.validate_json_request)])
    app.state.openai_serving_chat = recorder = ServingChatRecorder()
    routes.install_routes(app, environ={"KVFLOW_LEARNED_HINTS": "on"})
    try:
        yield TestClient(app), recorder, server
    finally:
        routes._learner = None


def test_plain_traffic_reaches_sglang_with_learned_hints_that_the_scheduler_applies(learned_app, make_rig) -> None:
    from backends.sglang_kvflow.hints_bridge import read_request_hint

    client, recorder, _ = learned_app
    conversations = [[{"role": "user", "content": f"Session {s}: the history of tide mills"}] for s in range(2)]
    for system in (SUPERVISOR, ANALYST, SUPERVISOR):
        for turns in conversations:
            r = client.post("/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "system", "content": system}, *turns]})
            assert r.status_code == 200, r.text
            turns.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    hints = [read_request_hint(flat) for flat in recorder.flat]
    assert all(h is not None for h in hints)
    sessions = [h.hint.workflow_id for h in hints]
    agents = [h.hint.agent.removesuffix(f"@{sid}") for h, sid in zip(hints, sessions, strict=True)]  # per session
    assert agents == ["supervisor"] * 2 + ["research-analyst"] * 2 + ["supervisor"] * 2
    assert sessions[0::2] == [sessions[0]] * 3 and sessions[1::2] == [sessions[1]] * 3 and sessions[0] != sessions[1]
    assert {h.hint.namespace for h in hints} == {"learned"}

    # the scheduler side: the flat form a queued request carries updates SGLang's hint table
    from backends.sglang_kvflow.state import get_state
    from backends.sglang_kvflow.tags import on_request_queued

    req = make_rig(size=32, policy="kvflow", hicache=False).make_req([1, 2, 3], recorder.flat[-1])
    queue = get_state()  # the rig's strategy configured the scheduler's state anew
    before = queue.counters["hinted_requests"]
    on_request_queued(None, req)
    assert queue.counters["hinted_requests"] == before + 1
    assert queue.hints.steps(("learned", hints[-1].hint.agent)) == 0

    stats = client.get("/kvflow/v1/stats").json()
    assert stats["ranks"] == 1
    assert stats["learner"]["enabled"] and stats["learner"]["learned_hint_requests"] == 6
    assert stats["learner"]["live_sessions"] == 2 and stats["learner"]["learned_agents"] == 2
    view = client.get("/kvflow/v1/learned").json()
    assert {a["name"] for a in view["agents"]} == {"supervisor", "research-analyst"}
    edges = {(t["from"], t["to"]) for t in view["namespaces"]["learned"]["transitions"]}
    assert ("supervisor", "research-analyst") in edges and ("research-analyst", "supervisor") in edges


def test_a_declared_hint_passes_through_and_sglang_still_refuses_a_bad_one(learned_app) -> None:
    client, recorder, _ = learned_app
    declared = {"kvflow": {"workflow_id": "wf-1", "namespace": "app", "agent": "coder", "steps": {"coder": 0}}}
    r = client.post("/v1/chat/completions", json={"model": "m", "custom_params": declared,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert recorder.flat[-1]["kvflow_hint"]["workflow_id"] == "wf-1"
    bad = {"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}
    with pytest.raises(ValueError, match="steps"):  # the plugin's hook refuses it as before (SGLang: a 400)
        client.post("/v1/chat/completions", json={"model": "m", "custom_params": bad,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    stats = client.get("/kvflow/v1/stats").json()["learner"]
    assert stats["declared_hint_requests"] == 1 and stats["learned_hint_requests"] == 0


def test_the_learned_route_is_404_while_the_learner_is_off(server) -> None:  # noqa: F811
    client, _, _ = server
    r = client.get("/kvflow/v1/learned")
    assert r.status_code == 404 and "--learned-hints" in r.json()["error"]["message"]
    assert client.get("/kvflow/v1/stats").json()["learner"] == {"enabled": False}
