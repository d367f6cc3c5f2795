"""The real model behind the server (slow: loads SmolLM2-135M): a chat completion gives sensible text,
and a second call sharing the system prompt reports it as cached."""

from __future__ import annotations

import httpx
import pytest

from server_helpers import assert_no_leak, start_server


@pytest.mark.slow
def test_smollm2_chat_completion_is_sensible_and_reuses_the_prefix() -> None:
    with start_server(model="smollm2-135m", device_tokens=4096, host_tokens=8192) as served:
        with httpx.Client(base_url=served.url, timeout=300) as client:
            system = {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}
            hint = {"workflow_id": "w", "agent": "geo", "steps": {"geo": 0}, "fixed_prefix": 1}
            body = {"model": "smollm2-135m", "max_tokens": 24, "temperature": 0, "custom_params": {"kvflow": hint},
                    "messages": [system, {"role": "user", "content": "What is the capital of France?"}]}
            first = client.post("/v1/chat/completions", json=body).json()
            assert "Paris" in first["choices"][0]["message"]["content"]
            body["messages"] = [system, {"role": "user", "content": "What is the capital of Italy?"}]
            second = client.post("/v1/chat/completions", json=body).json()
            assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 10
            assert_no_leak(client)
