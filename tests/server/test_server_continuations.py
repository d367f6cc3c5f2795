"""Continuations on the real server (tiny-random engine, uvicorn on 127.0.0.1) driven by the OpenAI
SDK (issue 24, point 2): a reply that ends in tool calls keeps its conversation for the session named
by ``user`` / ``prompt_cache_key`` (or by the hint), the return finds it cached, and
``/kvflow/v1/stats`` counts kept, reused and expired; greedy replies equal those of a server that
keeps nothing."""

from __future__ import annotations

import time
from typing import Any, Iterator

import httpx
import openai
import pytest

from backends.kvcache import common_prefix_len
from server_helpers import Served, assert_no_leak, start_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SYSTEM = {"role": "system", "content": "You answer weather questions with the get_weather tool."}


POOL = {"device_tokens": 1536, "host_tokens": 0}  # no host tier: what is evicted is recomputed


@pytest.fixture(scope="module")
def kept() -> Iterator[Served]:
    with start_server(tool_cold_hold_s=600.0, **POOL) as s:  # no deadline passes during the test
        yield s


@pytest.fixture(scope="module")
def plain() -> Iterator[Served]:
    with start_server(continuations=False, **POOL) as s:
        yield s


def _pressure(served: Served, tag: str) -> None:
    """Other, new sessions' calls during the tool's run: together more than the pool holds."""
    sdk = _sdk(served)
    for i in range(4):
        sdk.completions.create(model="tiny-random", prompt=f"{tag} {i} " + "lorem ipsum " * 36, max_tokens=1,
                               temperature=0)


def _sdk(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def _stats(served: Served) -> dict[str, Any]:
    return httpx.get(served.url + "/kvflow/v1/stats", timeout=30).json()


def _react(served: Served, session: dict[str, Any], question: str) -> tuple[Any, Any, int]:
    """A ReAct step: a call that must use the tool, then the return with the tool's result. Returns
    both replies and the cached prompt tokens of the return."""
    sdk = _sdk(served)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": question}]
    first = sdk.chat.completions.create(model="tiny-random", messages=messages, tools=[WEATHER], tool_choice=NAMED,
                                        temperature=0, max_tokens=96, **session)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    _pressure(served, question)
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "rain, 12 C"}]
    body = {"model": "tiny-random", "messages": messages, "tools": [WEATHER], "tool_choice": "auto",
            "temperature": 0, "max_tokens": 12, **session}
    second = sdk.chat.completions.create(**body)
    message = second.choices[0].message
    reply = (message.content, [(c.function.name, c.function.arguments) for c in message.tool_calls or []])
    return call.function, reply, second.usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("session", [{"user": "agent-1"}, {"extra_body": {"prompt_cache_key": "agent-2"}}],
                         ids=["user", "prompt_cache_key"])
def test_a_tool_call_keeps_the_conversation_for_the_sessions_return(kept: Served, plain: Served,
                                                                    session: dict[str, Any]) -> None:
    before = _stats(kept)
    call, answer, cached = _react(kept, session, "Weather in Oslo?")
    after = _stats(kept)
    assert after["continuations_kept"] == before["continuations_kept"] + 1
    assert after["continuations_reused"] == before["continuations_reused"] + 1
    assert after["continuations_expired"] == before["continuations_expired"]
    # what the return shares with the paused call: everything up to the tool call (the named choice's
    # instruction after the conversation and the reply's rendering differ)
    shared = common_prefix_len(kept.requests[-6][1].input_ids, kept.requests[-1][1].input_ids)
    assert shared > 400 and cached >= shared, f"the return found {cached} of {shared} shared tokens cached"

    plain_before = _stats(plain)
    plain_call, plain_answer, plain_cached = _react(plain, session, "Weather in Oslo?")
    assert (plain_call.name, plain_call.arguments, plain_answer) == (call.name, call.arguments, answer)
    assert _stats(plain)["continuations_kept"] == plain_before["continuations_kept"] == 0
    assert plain_cached < shared / 2, "without continuations the pressure should have evicted the conversation"
    with httpx.Client(base_url=kept.url, timeout=60) as client:
        assert_no_leak(client)


def test_a_streamed_tool_call_is_kept_too(kept: Served) -> None:
    before = _stats(kept)
    sdk = _sdk(kept)
    chunks = list(sdk.chat.completions.create(
        model="tiny-random", messages=[SYSTEM, {"role": "user", "content": "Weather in Lima?"}], tools=[WEATHER],
        tool_choice=NAMED, temperature=0, max_tokens=96, user="agent-3", stream=True))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert _stats(kept)["continuations_kept"] == before["continuations_kept"] + 1


def test_without_a_session_nothing_is_kept(kept: Served) -> None:
    before = _stats(kept)
    _sdk(kept).chat.completions.create(model="tiny-random", messages=[SYSTEM, {"role": "user", "content": "Rome?"}],
                                       tools=[WEATHER], tool_choice=NAMED, temperature=0, max_tokens=96)
    assert _stats(kept)["continuations_kept"] == before["continuations_kept"]


def test_an_announced_pause_that_outlasts_its_deadline_expires() -> None:
    # a server of its own: on the module's, continuations other tests left (their tools' learned
    # deadlines are about a second) may expire during the wait as well
    with start_server(**POOL) as served:
        hint = {"workflow_id": "wf-expire", "agent": "planner", "resume_in_s": 0}
        sdk = _sdk(served)
        before = _stats(served)
        sdk.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "Plan a trip."}],
                                    temperature=0, max_tokens=4, extra_body={"custom_params": {"kvflow": hint}})
        assert _stats(served)["continuations_kept"] == before["continuations_kept"] + 1
        time.sleep(1.2)  # past the deadline: 0 s announced, plus the one-second grace
        sdk.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "Anything."}],
                                    temperature=0, max_tokens=2)  # any arrival applies deadlines
        after = _stats(served)
        assert after["continuations_expired"] == before["continuations_expired"] + 1
        assert after["continuations_reused"] == before["continuations_reused"]


def test_a_responses_function_call_is_kept_too(kept: Served) -> None:
    before = _stats(kept)
    tool = {"type": "function", **WEATHER["function"]}
    out = _sdk(kept).responses.create(model="tiny-random", input="Weather in Kyiv?", tools=[tool],
                                      tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                      max_output_tokens=96, user="agent-4")
    assert out.output[0].type == "function_call"
    assert _stats(kept)["continuations_kept"] == before["continuations_kept"] + 1
