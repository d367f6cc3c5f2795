"""``cache_salt`` (vLLM's field) on every generation route: requests with different salts (or one
salted, one not) never share cached KV, so ``cached_tokens`` reveals nothing of what another salt's
client sent; under one salt the cache works as before, and greedy outputs never change."""

from __future__ import annotations

import uuid

import httpx
import pytest

from backends.kvcache import common_prefix_len
from server_helpers import Served, assert_no_leak


def _chat(client: httpx.Client, prompt: str, salt: str | None) -> tuple[str, int]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "temperature": 0,
            **({"cache_salt": salt} if salt is not None else {})}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _completion(client: httpx.Client, prompt: str, salt: str | None) -> tuple[str, int]:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, **({"cache_salt": salt} if salt else {})}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _responses(client: httpx.Client, prompt: str, salt: str | None) -> tuple[str, int]:
    body = {"input": prompt, "max_output_tokens": 6, "temperature": 0, **({"cache_salt": salt} if salt else {})}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()["output"][0]["content"][0]["text"], r.json()["usage"]["input_tokens_details"]["cached_tokens"]


def _generate(client: httpx.Client, prompt: str, salt: str | None) -> tuple[str, int]:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0},
            **({"cache_salt": salt} if salt else {})}
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["text"], r.json()["meta_info"]["cached_tokens"]


def _prompt() -> str:
    return f"{uuid.uuid4().hex} is a prefix another tenant might guess " * 4


@pytest.mark.parametrize("send", [_chat, _completion, _responses, _generate])
def test_different_salts_never_share_cached_kv(served: Served, client: httpx.Client, send) -> None:
    prompt, salt = _prompt(), f"tenant-a-{uuid.uuid4().hex}"  # fresh: even the BOS token is cached per salt
    first, cached = send(client, prompt, salt)
    assert cached == 0
    again, cached_again = send(client, prompt, salt)
    assert cached_again > 0 and again == first  # one salt: the cache works, the output is the same
    for other in (f"tenant-b-{uuid.uuid4().hex}", salt.upper()):  # any other salt hits nothing tenant-a cached
        text, cached = send(client, prompt, other)
        assert cached == 0 and text == first, other  # greedy output identical, computed from scratch
    # Unsalted, the prompt hits at most what it shares with earlier unsalted prompts (BOS, the chat
    # template's head): nothing of what tenant-a cached.
    text, cached = send(client, prompt, None)
    ids = served.requests[-1][1].input_ids
    shared_head = max((common_prefix_len(req.input_ids, ids) for _, req in served.requests[:-1]
                       if req.cache_salt is None), default=0)
    assert cached <= shared_head < cached_again and text == first
    text, cached = send(client, prompt, None)
    assert cached > shared_head and text == first  # unsalted requests share among themselves as before
    assert_no_leak(client)


@pytest.mark.parametrize("salt", ["", "a/b", "a@b", "a\\b", "a\x00b", "x" * 129, 7, True])
def test_a_bad_salt_is_a_400_naming_the_field(served: Served, client: httpx.Client, salt: object) -> None:
    seen = len(served.requests)
    for route, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/v1/completions", {"prompt": "hi"}), ("/v1/responses", {"input": "hi"}),
                        ("/generate", {"text": "hi"})]:
        r = client.post(route, json={**body, "cache_salt": salt})
        assert r.status_code == 400, (route, salt, r.text)
        assert r.json()["error"]["param"] == "cache_salt", (route, r.json())
    assert len(served.requests) == seen
