"""Behaviours every kvflow backend must show, whatever sits between the caller and the cache:
prefix reuse reported as cached tokens, greedy output independent of cache state, steps updates
taken, monotonic counters, and streaming equal to non-streaming. Runs on each ``backend``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from backends.kvcache.stats import CacheStats
from backends_under_test import Backend
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

COUNTERS = [f.name for f in dataclasses.fields(CacheStats)]


def _agent_prompt(words: int = 20) -> str:
    # A fresh system prompt per test, so no test sees another's cached prefix.
    tag = uuid.uuid4().hex[:8]
    return f"[{tag}] You are a careful planner. " + " ".join(f"step{i}" for i in range(words))


def _chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _hint(agent: str = "planner", **steps: int | None) -> KVFlowHint:
    return KVFlowHint(workflow_id=f"wf-{agent}", agent=agent, steps=steps or {agent: 0}, fixed_prefix=1)


async def test_second_call_with_the_same_prefix_reports_cached_tokens(backend: Backend) -> None:
    system = _agent_prompt()
    first = await backend.chat(_chat(system, "Plan a trip."), max_tokens=4, hint=_hint())
    second = await backend.chat(_chat(system, "Plan a party instead."), max_tokens=4, hint=_hint())
    assert first.cached_tokens < first.prompt_tokens
    # At least the agent's system prompt (about 170 byte-level tokens on tiny-random; whole blocks
    # of it on vLLM) is reused, never more than the prompt.
    assert backend.min_prefix_reuse <= second.cached_tokens < second.prompt_tokens
    assert second.cached_tokens > first.cached_tokens


async def test_greedy_output_is_the_same_cold_hit_and_after_eviction(backend: Backend) -> None:
    messages = _chat(_agent_prompt(), "Write the first line of a poem.")
    cold = await backend.chat(messages, max_tokens=12, hint=_hint())
    hit = await backend.chat(messages, max_tokens=12, hint=_hint())
    assert hit.cached_tokens > cold.cached_tokens
    # Push it out of the 1,024-token device pool with other agents' prompts (to host, or dropped).
    evicted = (await backend.stats())["evicted_device_tokens"]
    for i in range(4):
        await backend.chat(_chat(_agent_prompt(words=45), f"filler {i}"), max_tokens=2, hint=_hint(f"other{i}"))
    assert (await backend.stats())["evicted_device_tokens"] > evicted
    again = await backend.chat(messages, max_tokens=12, hint=_hint())
    assert hit.text == cold.text and again.text == cold.text
    assert (hit.completion_tokens, again.completion_tokens) == (cold.completion_tokens,) * 2


async def _wait_for(backend: Backend, predicate, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await backend.stats()
        if predicate(stats):
            return stats
        assert time.monotonic() < deadline, f"stats never satisfied the condition: {stats}"
        await asyncio.sleep(0.02)


async def test_steps_update_is_taken_and_done_forgets_the_workflow(backend: Backend) -> None:
    before = (await backend.stats())["workflows"]
    workflow = f"wf-{uuid.uuid4().hex[:8]}"
    await backend.apply_steps(StepsUpdate(workflow_id=workflow, steps={"planner": 0, "coder": 2, "qa": None}))
    await _wait_for(backend, lambda s: s["workflows"] == before + 1)
    hint = KVFlowHint(workflow_id=workflow, agent="planner", steps={"planner": 0, "coder": 1}, fixed_prefix=1)
    reply = await backend.chat(_chat(_agent_prompt(), "go"), max_tokens=2, hint=hint)
    assert reply.completion_tokens >= 1
    await backend.apply_steps(StepsUpdate(workflow_id=workflow, done=True))
    await _wait_for(backend, lambda s: s["workflows"] == before)


async def test_cache_counters_only_grow(backend: Backend) -> None:
    before = await backend.stats()
    system = _agent_prompt()
    replies = [await backend.chat(_chat(system, user), max_tokens=3, hint=_hint()) for user in ("one", "two", "three")]
    after = await backend.stats()
    for name in COUNTERS:
        assert after[name] >= before[name], name
    # Three prompts' worth of tokens went through admission: every prompt token is counted once.
    assert sum(after[n] - before[n] for n in ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens",
                                              "recomputed_tokens")) == sum(r.prompt_tokens for r in replies)
    assert after["device_hit_tokens"] > before["device_hit_tokens"]


async def test_streaming_text_equals_non_streaming_text(backend: Backend) -> None:
    messages = _chat(_agent_prompt(), "Tell me a story.")
    plain = await backend.chat(messages, max_tokens=16, hint=_hint())
    streamed = await backend.chat(messages, max_tokens=16, hint=_hint(), stream=True)
    assert streamed.text == plain.text
    assert streamed.completion_tokens == plain.completion_tokens
    assert streamed.prompt_tokens == plain.prompt_tokens


async def test_concurrent_requests_get_the_answers_they_get_alone(backend: Backend) -> None:
    system = _agent_prompt()
    users = [f"Question number {i}: what next?" for i in range(6)]
    alone = [await backend.chat(_chat(system, u), max_tokens=10, hint=_hint()) for u in users]
    together = await asyncio.gather(*(backend.chat(_chat(system, u), max_tokens=10, hint=_hint()) for u in users))
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.prompt_tokens for r in together] == [r.prompt_tokens for r in alone]
