"""Every route of the embedded server answers in the documented shape, against the real tiny-random
engine on 127.0.0.1: OpenAI chat/completions (plain and SSE), SGLang's /generate, kvflow's routes,
/health and /metrics; hints reach the engine from both placements."""

from __future__ import annotations

import json
import re

import httpx

from kvflow_orch.protocol import KVFlowHint, attach_hint
from server_helpers import Served, assert_no_leak

SYSTEM = "You are the architect. Design the modules carefully and list them."
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Build a todo app."}]
HINT = KVFlowHint(workflow_id="wf-1", agent="architect", steps={"architect": 0, "engineer": 1}, fixed_prefix=1)


def _events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]


def test_chat_completion_shape_and_usage(client: httpx.Client, served: Served) -> None:
    model = client.get("/v1/models").json()["data"][0]["id"]
    body = attach_hint({"model": model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}, HINT)
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion" and data["model"] == model
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in {"stop", "length"}
    usage = data["usage"]
    assert usage["completion_tokens"] <= 6 and usage["prompt_tokens"] > 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
    route, request = served.requests[-1]
    assert route == "chat" and request.hint == HINT
    # fixed_prefix=1 message: the engine is told where the system prompt's tokens end.
    assert request.fixed_prefix_tokens is not None and 0 < request.fixed_prefix_tokens < usage["prompt_tokens"]
    assert len(request.input_ids) == usage["prompt_tokens"]
    assert_no_leak(client)


def test_chat_stream_is_sse_with_role_content_finish_usage_done(client: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 5
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    plain = client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert streamed == plain["choices"][0]["message"]["content"]


def test_completions_text_and_token_ids(client: httpx.Client, served: Served) -> None:
    r = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "text_completion" and data["usage"]["completion_tokens"] <= 4
    ids = list(served.requests[-1][1].input_ids)
    by_ids = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4, "temperature": 0}).json()
    assert by_ids["choices"][0]["text"] == data["choices"][0]["text"]
    stream = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True})
    events = _events(stream)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == data["choices"][0]["text"]


def test_generate_sglang_shape_with_hint_in_sampling_params(client: httpx.Client, served: Served) -> None:
    hint = KVFlowHint(workflow_id="wf-2", agent="coder", steps={"coder": 0}, fixed_prefix=10)
    body = attach_hint({"text": "The quick brown fox jumps",
                        "sampling_params": {"max_new_tokens": 5, "temperature": 0}},
                       hint, route="generate")
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    meta = data["meta_info"]
    assert set(meta) >= {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason"}
    assert meta["completion_tokens"] == len(data["output_ids"]) <= 5
    assert meta["finish_reason"]["type"] in {"stop", "length"}
    route, request = served.requests[-1]
    assert route == "generate" and request.hint == hint and request.fixed_prefix_tokens is not None
    again = client.post("/generate", json={"input_ids": list(request.input_ids),
                                           "sampling_params": {"max_new_tokens": 5, "temperature": 0}}).json()
    assert again["output_ids"] == data["output_ids"] and again["text"] == data["text"]
    streamed = client.post("/generate", json={**body, "stream": True})
    events = _events(streamed)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    # SGLang streams cumulative text; the last event carries the complete answer and meta_info.
    assert last["text"] == data["text"] and last["meta_info"]["finish_reason"] == meta["finish_reason"]


def test_kvflow_routes_info_steps_stats_health(client: httpx.Client, served: Served) -> None:
    info = client.get("/kvflow/v1/info").json()
    assert info["model"] == "tiny-random" and info["policy"] == "kvflow"
    # where the routes read them
    assert info["hints"] == {"openai": ["custom_params.kvflow"], "responses": ["custom_params.kvflow"]}
    update = {"workflow_id": "wf-3", "namespace": "team-a", "steps": {"a": 2, "b": None}}
    r = client.post("/kvflow/v1/steps", json=update)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert served.steps[-1].model_dump() == {**update, "done": False}
    assert client.post("/kvflow/v1/steps", json={**update, "done": True}).status_code == 200
    stats = client.get("/kvflow/v1/stats").json()
    assert "wf-3" not in json.dumps(stats) and "team-a" not in json.dumps(stats)
    assert client.get("/health").json() == {"status": "ok"}


def test_metrics_prometheus_text(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    client.post("/v1/chat/completions", json={"messages": []})
    text = client.get("/metrics").text
    assert "# TYPE kvflow_http_requests_total counter" in text
    ok = re.search(r'kvflow_http_requests_total\{method="POST",path="/v1/chat/completions",status="200"\} (\d+)', text)
    bad = re.search(r'kvflow_http_requests_total\{method="POST",path="/v1/chat/completions",status="400"\} (\d+)', text)
    assert ok and int(ok.group(1)) >= 1 and bad and int(bad.group(1)) >= 1
    assert re.search(r"^kvflow_engine_\w+ [0-9.e+-]+$", text, re.M)
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r'[a-zA-Z_:][\w:]*(\{[^}]*\})? [^ ]+', line), line
