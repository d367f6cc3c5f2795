"""``kvflow serve --engine vllm`` on SmolLM2 with a small KV pool (one server for the module):
hints in ``custom_params.kvflow`` reach the scheduler, the fixed prompt of a hinted agent outlives
untagged prefixes in vLLM's own prefix cache, greedy output never depends on the cache, and the
/kvflow/v1 routes answer (bad input with a 4xx naming the problem)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from vllm_server import HAVE_VLLM, SKIP_REASON, export_smollm2, vllm_server  # noqa: E402

from kvflow_orch.protocol import KVFlowHint, attach_hint  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON), pytest.mark.timeout(1200)]

BLOCK = 128
POOL_TOKENS = 15 * BLOCK  # 15 usable blocks (the launcher adds vLLM's null block)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("vllm")
    model = export_smollm2(folder)
    with vllm_server(model, folder / "server.log", ["--device-tokens", str(POOL_TOKENS), "--api-key", "sekret"]) as u:
        yield u


AUTH = {"Authorization": "Bearer sekret"}


WORDS = ("check", "the", "plan", "before", "you", "write", "code", "and", "test", "every", "change", "with", "care")


def _system(words: int) -> str:
    """About ``words`` tokens (common words are one token each), unique to this call."""
    tag = uuid.uuid4().hex[:8]
    return f"[{tag}] You are a meticulous agent. " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


def _chat(url: str, system: str, user: str, hint: KVFlowHint | None = None, max_tokens: int = 8) -> dict:
    body = {"model": _model(url), "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens, "temperature": 0}
    if hint is not None:
        body = attach_hint(body, hint)
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()
    return {"text": data["choices"][0]["message"]["content"], "prompt": data["usage"]["prompt_tokens"],
            "cached": (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0}


_MODELS: dict[str, str] = {}


def _model(url: str) -> str:
    if url not in _MODELS:
        _MODELS[url] = httpx.get(url + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"]
    return _MODELS[url]


def _stats(url: str) -> dict:
    r = httpx.get(url + "/kvflow/v1/stats", headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_info_names_the_backend_the_policy_and_where_hints_go(url: str) -> None:
    info = httpx.get(url + "/kvflow/v1/info", headers=AUTH, timeout=60).json()
    assert info["backend"] == "vllm" and info["policy"] == "kvflow" and info["protocol"] == 1
    assert info["capacities"]["block_size"] == BLOCK
    assert info["capacities"]["device_tokens"] == POOL_TOKENS
    assert "custom_params.kvflow" in info["hints"]["openai"]
    assert info["routes"]["steps"] == "/kvflow/v1/steps"


def test_routes_check_the_api_key(url: str) -> None:
    for path in ("/kvflow/v1/info", "/kvflow/v1/stats"):
        assert httpx.get(url + path, timeout=30).status_code == 401
    assert httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "w"}, timeout=30).status_code == 401


def test_bad_hints_and_steps_get_a_4xx_naming_the_field(url: str) -> None:
    body = {"model": _model(url), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and "steps" in r.json()["error"]["message"]
    body.pop("custom_params")
    body["kv_transfer_params"] = {"kvflow": {"agent": "a"}}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and "workflow_id" in r.json()["error"]["message"]
    r = httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "w", "steps": {"a": "soon"}}, headers=AUTH, timeout=60)
    assert r.status_code == 422 and "steps" in r.json()["error"]["message"]
    r = httpx.post(url + "/kvflow/v1/steps", content=b"{", headers=AUTH, timeout=60)
    assert r.status_code == 400


def test_steps_updates_reach_the_scheduler(url: str) -> None:
    before = _stats(url)
    r = httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "wf-steps", "steps": {"a": 0, "b": None}},
                   headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["agents"] == 2
    mid = _stats(url)
    assert mid["workflows"] == before["workflows"] + 1 and mid["steps_updates"] == before["steps_updates"] + 1
    httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "wf-steps", "done": True}, headers=AUTH, timeout=60)
    assert _stats(url)["workflows"] == before["workflows"]


def test_a_hinted_agents_fixed_prompt_outlives_untagged_prefixes(url: str) -> None:
    """Pool: 15 blocks. The hinted agent's and an unhinted caller's system prompts (3+ blocks each)
    are cached, then four unrelated 4-block prompts pass through: stock LRU would evict the two
    oldest prefixes first; kvflow evicts untagged blocks first and keeps the agent's."""
    agent_system, plain_system = _system(420), _system(420)
    hint = KVFlowHint(workflow_id="wf-live", agent="planner", steps={"planner": 0, "coder": 1}, fixed_prefix=1)
    before = _stats(url)
    cold = _chat(url, agent_system, "Plan the release.", hint, max_tokens=12)
    _chat(url, plain_system, "Plan the release.")
    assert cold["prompt"] >= 3 * BLOCK
    mid = _stats(url)
    assert mid["hinted_requests"] == before["hinted_requests"] + 1
    assert mid["tagged_requests"] == before["tagged_requests"] + 1
    assert mid["tagged_blocks"] >= before["tagged_blocks"] + 3
    later = KVFlowHint(workflow_id="wf-live", agent="coder", steps={"planner": 1, "coder": 0})
    for i in range(4):  # the planner runs again after the coder: its prefix must survive this
        _chat(url, _system(540), f"filler {i}", later if i == 0 else None, max_tokens=2)
    after = _stats(url)
    assert after["evicted_device_tokens"] > mid["evicted_device_tokens"]
    again = _chat(url, agent_system, "Plan the release.", hint, max_tokens=12)
    plain = _chat(url, plain_system, "Plan the release.")
    assert again["cached"] >= 3 * BLOCK, (again, after)
    assert plain["cached"] == 0, plain
    assert again["text"] == cold["text"]  # greedy output is the same cold and from the cache
