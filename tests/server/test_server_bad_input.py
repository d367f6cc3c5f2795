"""Bad input against the real server: each case gets a 4xx with the JSON error shape and a message
naming the problem; afterwards the server still serves and no KV slot is held (leak check).
Clients that disconnect mid-stream or mid-request get their request cancelled and slots freed."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from server_helpers import DEVICE_TOKENS, Served, assert_no_leak

USER = [{"role": "user", "content": "hello there"}]
GOOD_HINT = {"workflow_id": "w", "agent": "a", "steps": {"a": 0}}


def _hint(**overrides: Any) -> dict[str, Any]:
    return {"messages": USER, "custom_params": {"kvflow": {**GOOD_HINT, **overrides}}}


CASES: list[tuple[str, str, Any, int, str]] = [
    # id, route, body (bytes are sent raw), status, text the message must contain
    ("malformed-json", "/v1/chat/completions", b'{"messages": [', 400, "not valid JSON"),
    ("json-array", "/v1/chat/completions", b"[1, 2]", 400, "object"),
    ("empty-body", "/v1/chat/completions", b"", 400, "JSON"),
    ("no-messages-field", "/v1/chat/completions", {"model": "tiny-random"}, 400, "messages"),
    ("empty-messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("content-wrong-type", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages.0.content"),
    ("bad-role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("image-part", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages.0.content"),
    ("max-tokens-zero", "/v1/chat/completions", {"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
    ("max-tokens-negative", "/v1/chat/completions", {"messages": USER, "max_tokens": -5}, 400, "max_tokens"),
    ("max-tokens-absurd", "/v1/chat/completions", {"messages": USER, "max_tokens": 10**12}, 400, "max_tokens"),
    ("max-tokens-string", "/v1/chat/completions", {"messages": USER, "max_tokens": "10"}, 400, "max_tokens"),
    ("temperature-negative", "/v1/chat/completions", {"messages": USER, "temperature": -1}, 400, "temperature"),
    ("top-p-negative", "/v1/chat/completions", {"messages": USER, "top_p": -0.1}, 400, "top_p"),
    ("stop-empty-string", "/v1/chat/completions", {"messages": USER, "stop": ["ok", ""]}, 400, "stop"),
    ("temperature-nan", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "NaN"),
    ("n-too-many", "/v1/chat/completions", {"messages": USER, "n": 17}, 400, "n"),
    ("n-two-streamed", "/v1/chat/completions", {"messages": USER, "n": 2, "stream": True}, 400, "n > 1"),
    ("seed-65-bit", "/v1/chat/completions", {"messages": USER, "seed": 2**64}, 400, "seed"),
    ("logit-bias-not-a-token", "/v1/chat/completions", {"messages": USER, "logit_bias": {"hi": 5}}, 400, "logit_bias"),
    ("logit-bias-too-big", "/v1/chat/completions", {"messages": USER, "logit_bias": {"3": 500}}, 400, "logit_bias"),
    ("logit-bias-out-of-vocab", "/v1/chat/completions", {"messages": USER, "logit_bias": {"999999999": 1}}, 400,
     "vocabulary"),
    ("top-logprobs-without-logprobs", "/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("top-logprobs-too-many", "/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
    ("presence-penalty-out-of-range", "/v1/chat/completions", {"messages": USER, "presence_penalty": 3}, 400,
     "presence_penalty"),
    ("top-k-negative", "/v1/chat/completions", {"messages": USER, "top_k": -2}, 400, "top_k"),
    ("min-p-over-one", "/v1/chat/completions", {"messages": USER, "min_p": 1.5}, 400, "min_p"),
    ("unknown-model", "/v1/chat/completions", {"model": "gpt-9", "messages": USER}, 404, "gpt-9"),
    ("hint-negative-steps", "/v1/chat/completions", _hint(steps={"a": -3}), 400, "steps"),
    ("hint-100k-agents", "/v1/chat/completions", _hint(steps={f"agent{i}": 1 for i in range(100_000)}), 400, "steps"),
    ("hint-steps-wrong-type", "/v1/chat/completions", _hint(steps={"a": "soon"}), 400, "steps.a"),
    ("hint-steps-not-a-map", "/v1/chat/completions", _hint(steps=[1, 2]), 400, "steps"),
    ("hint-missing-agent", "/v1/chat/completions",
     {"messages": USER, "custom_params": {"kvflow": {"workflow_id": "w"}}}, 400, "agent"),
    ("hint-not-object", "/v1/chat/completions", {"messages": USER, "custom_params": {"kvflow": 7}}, 400, "kvflow"),
    ("hint-resume-negative", "/v1/chat/completions", _hint(resume_in_s=-1), 400, "resume_in_s"),
    ("hint-resume-past-a-day", "/v1/chat/completions", _hint(resume_in_s=1e6), 400, "resume_in_s"),
    ("hint-resume-wrong-type", "/v1/chat/completions", _hint(resume_in_s="soon"), 400, "resume_in_s"),
    ("hint-resume-infinite", "/v1/chat/completions", _hint(resume_in_s=10**400), 400, "resume_in_s"),
    ("user-too-long", "/v1/chat/completions", {"messages": USER, "user": "u" * 1000}, 400, "user"),
    ("prompt-cache-key-wrong-type", "/v1/chat/completions", {"messages": USER, "prompt_cache_key": 7}, 400,
     "prompt_cache_key"),
    ("hint-fixed-prefix-too-far", "/v1/chat/completions", _hint(fixed_prefix=5), 400, "fixed_prefix"),
    ("prompt-longer-than-pool", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "word " * (DEVICE_TOKENS * 2)}], "max_tokens": 4}, 400, "token"),
    ("completion-empty-prompt", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("completion-two-prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "one prompt"),
    ("completion-negative-ids", "/v1/completions", {"prompt": [1, -2]}, 400, "prompt"),
    ("completion-out-of-vocab", "/v1/completions", {"prompt": [1, 10**9]}, 400, "vocabulary"),
    ("generate-no-prompt", "/generate", {"sampling_params": {}}, 400, "text or input_ids"),
    ("generate-both-prompts", "/generate", {"text": "a", "input_ids": [1]}, 400, "text or input_ids"),
    ("generate-batch", "/generate", {"text": ["a", "b"]}, 400, "batched"),
    ("generate-unknown-sampling-key", "/generate", {"text": "a", "sampling_params": {"beam": 4}}, 400,
     "sampling_params.beam"),
    ("generate-unsupported-min-new-tokens", "/generate", {"text": "a", "sampling_params": {"min_new_tokens": 5}}, 400,
     "min_new_tokens"),
    ("generate-seed-65-bit", "/generate", {"text": "a", "sampling_params": {"sampling_seed": -(2**64)}}, 400,
     "sampling_seed"),
    ("generate-temperature-nan", "/generate", b'{"text": "a", "sampling_params": {"temperature": NaN}}', 400, "NaN"),
    ("generate-max-new-tokens-zero", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, 400,
     "max_new_tokens"),
    ("generate-hint-negative", "/generate",
     {"text": "a", "sampling_params": {"custom_params": {"kvflow": {**GOOD_HINT, "steps": {"a": -1}}}}}, 400, "steps"),
    ("steps-negative", "/kvflow/v1/steps", {"workflow_id": "w", "steps": {"a": -1}}, 422, "steps"),
    ("steps-100k-agents", "/kvflow/v1/steps", {"workflow_id": "w", "steps": {f"x{i}": 0 for i in range(100_000)}}, 422,
     "steps"),
    ("steps-no-workflow", "/kvflow/v1/steps", {"steps": {}}, 422, "workflow_id"),
    ("steps-long-name", "/kvflow/v1/steps", {"workflow_id": "w" * 1000}, 422, "workflow_id"),
    ("steps-done-wrong-type", "/kvflow/v1/steps", {"workflow_id": "w", "done": {"x": 1}}, 422, "done"),
]


@pytest.mark.parametrize("route, body, status, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_json_4xx(client: httpx.Client, route: str, body: Any, status: int, needle: str) -> None:
    if isinstance(body, bytes):
        r = client.post(route, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(route, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["code"], str)
    assert needle in error["message"], error["message"]
    assert client.get("/health").status_code == 200
    assert_no_leak(client)


def test_body_over_the_size_limit_is_413(client: httpx.Client) -> None:
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]})
    r = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is enforced on the bytes received
        for _ in range(6):
            yield b"x" * (1024 * 1024)

    r = client.post("/kvflow/v1/steps", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert_no_leak(client)


def test_unknown_route_and_wrong_method_are_json(client: httpx.Client) -> None:
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and "message" in r.json()["error"]
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "message" in r.json()["error"]


def _decode_steps(client: httpx.Client) -> int:
    return int(client.get("/kvflow/v1/stats").json()["decode_steps"])


LONG = 900  # fits the 1,024-token pool with the prompt; far more decode steps than the test waits for


def test_client_disconnect_mid_stream_cancels_and_frees(client: httpx.Client, served: Served) -> None:
    body = {"messages": USER, "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "stream": True}
    before = _decode_steps(client)
    with httpx.Client(base_url=served.url, timeout=60) as other:
        with other.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:
                    break  # leaving the block closes the connection mid-stream
    assert_no_leak(client)
    # Cancelled, not run to completion: far fewer decode steps than tokens asked for.
    assert _decode_steps(client) - before < LONG // 2
    r = client.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_client_disconnect_while_waiting_for_a_whole_answer(client: httpx.Client, served: Served) -> None:
    """A raw socket that sends a request needing many tokens, then hangs up before the answer."""
    url = urlparse(served.url)
    payload = json.dumps({"messages": USER, "max_tokens": LONG, "ignore_eos": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    before = _decode_steps(client)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head + payload)
        deadline = time.monotonic() + 10
        while _decode_steps(client) - before < 5:  # the engine is decoding it
            assert time.monotonic() < deadline, "the request never started decoding"
            time.sleep(0.01)
    assert_no_leak(client)
    assert _decode_steps(client) - before < LONG // 2
    assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}).status_code == 200
