"""One namespace cannot take over the device cache by claiming that all its agents run next.

A "greedy" namespace sends four agents with 300-token fixed prompts, all at steps 0 (1,200 tokens of
claimed protection on a 1,400-token device pool whose per-namespace cap is half of it, 700). A "fair"
namespace's agent is due next (steps 1). With the cap, the greedy namespace protects only what fits
in 700 tokens; its other agents fall back to LRU and are evicted before the fair agent's prefix, which
is still on device when it runs again. The control: the same agent inside the greedy namespace shares
that namespace's cap, loses protection, and is evicted (no host tier: evicted KV is gone).
"""

from __future__ import annotations

import httpx
import pytest

from kvflow_live import hint_summary, live_server, wait_idle

DEVICE_TOKENS = 1400
PROMPT_CHARS = 300  # the tiny-random tokenizer is byte-level: one token per character


def system(agent: str) -> str:
    return (f"You are agent {agent}. " * 40)[:PROMPT_CHARS]


def chat(client: httpx.Client, namespace: str, workflow: str, agent: str, steps: dict) -> dict:
    body = {"messages": [{"role": "system", "content": system(agent)}, {"role": "user", "content": "Go on."}],
            "max_tokens": 4, "temperature": 0,
            "custom_params": {"kvflow": {"workflow_id": workflow, "namespace": namespace, "agent": agent,
                                         "steps": steps, "fixed_prefix": 1}}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


@pytest.mark.parametrize("fair_namespace, survives", [("fair", True), ("greedy", False)],
                         ids=["own-namespace-keeps-its-share", "control-same-namespace-loses-it"])
def test_namespace_cap_bounds_protection_whatever_steps_it_claims(fair_namespace: str, survives: bool) -> None:
    greedy = [f"g{i}" for i in range(4)]
    claim = {agent: 0 for agent in greedy}
    with live_server(device_tokens=DEVICE_TOKENS, host_tokens=0, policy="kvflow") as live, \
            httpx.Client(base_url=live.url, timeout=60) as client:
        first = chat(client, fair_namespace, "wf-fair", "f", {"f": 0})
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        # the fair agent runs next in its workflow
        client.post("/kvflow/v1/steps", json={"workflow_id": "wf-fair", "namespace": fair_namespace,
                                              "steps": {"f": 1}}).raise_for_status()
        for agent in greedy:
            chat(client, "greedy", "wf-greedy", agent, claim)
        summary = hint_summary(client)
        assert summary["namespace_cap_tokens"] == DEVICE_TOKENS // 2
        assert 0 < summary["max_protected_tokens"] <= summary["namespace_cap_tokens"], summary
        stats = wait_idle(client)
        assert stats["evicted_device_tokens"] > 0  # the pool really was under pressure

        again = chat(client, fair_namespace, "wf-fair", "f", {"f": 0})
        fixed = PROMPT_CHARS  # the system message's content; the template adds a few tokens around it
        cached = again["prompt_tokens_details"]["cached_tokens"]
        if survives:
            assert cached >= fixed, f"the fair agent's prefix was evicted: {cached} cached tokens"
        else:
            assert cached < fixed, f"control: expected the prefix to be evicted, {cached} cached tokens"
