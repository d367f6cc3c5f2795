"""Tools sit in a tool-using agent's cached prefix (issue 24, point 1), on the real server (tiny-random
engine, uvicorn on 127.0.0.1) driven by the OpenAI SDK: an agent's repeat call with a new user turn
finds everything before that turn cached (its system prompt and its tools), whatever ``tool_choice``
each call sends, streamed or not, on both APIs; a declared ``fixed_prefix`` and the brain's
shared-prefix rule cover the tools; greedy replies are the same cold (a fresh server) and cached."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from backends.kvcache import AgentRequest, CacheConfig, RequestIntake, common_prefix_len
from backends.local.tokenizer import ChatTokenizer, byte_level_tokenizer
from kvflow_orch.protocol import KVFlowHint
from server_helpers import Served, assert_no_leak, start_server

TOKENIZER = ChatTokenizer(byte_level_tokenizer(), None, frozenset())  # tiny-random's own tokenizer
SYSTEM = "You route questions. Hand every weather question to the weather agent, and time questions to the clock."
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                          "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, CLOCK]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def sdk(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def _turn_start(ids: tuple[int, ...], role: str, content: str) -> int:
    """Where the message ``role: content`` starts in a prompt's tokens (each message opens with its
    ``<|im_start|>role`` header in the ChatML template tiny-random uses)."""
    needle = TOKENIZER.encode(f"<|im_start|>{role}\n{content}")
    for i in range(len(ids) - len(needle) + 1):
        if list(ids[i:i + len(needle)]) == needle:
            return i
    raise AssertionError(f"the {role} turn {content!r} is not in the prompt")


def _call(sdk: openai.OpenAI, served: Served, messages: list[dict[str, Any]], choice: Any, stream: bool,
          **extra: Any) -> tuple[tuple[int, ...], int, Any]:
    """One chat call: the prompt's token ids the engine got, the cached tokens the server counted,
    and the reply's message (a stream's deltas put together)."""
    body = {"model": "tiny-random", "messages": messages, "tools": TOOLS, "tool_choice": choice, "temperature": 0,
            "max_tokens": 48, **extra}
    if not stream:
        out = sdk.chat.completions.create(**body)
        return served.requests[-1][1].input_ids, out.usage.prompt_tokens_details.cached_tokens, out.choices[0].message
    chunks = list(sdk.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc.function for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    return served.requests[-1][1].input_ids, usage.prompt_tokens_details.cached_tokens, (text, calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("first,second", [("auto", "auto"), ("required", "auto"), (NAMED, NAMED), (NAMED, "required")],
                         ids=["auto", "required-then-auto", "named", "named-then-required"])
def test_repeat_call_caches_system_prompt_and_tools(sdk: openai.OpenAI, served: Served, client: httpx.Client,
                                                    first: Any, second: Any, stream: bool) -> None:
    tag = f"{json.dumps(first)}-{json.dumps(second)}-{stream}"  # a system prompt of its own per case
    system = {"role": "system", "content": f"{SYSTEM} ({tag})"}
    question = {"role": "user", "content": "What is the weather in Oslo?"}
    ids1, _, _ = _call(sdk, served, [system, question], first, stream)
    new_turn = "And what time is it in Lima?"
    ids2, cached, _ = _call(sdk, served, [system, {"role": "user", "content": new_turn}], second, stream)
    before = _turn_start(ids2, "user", new_turn)
    head = TOKENIZER.decode(ids2[:before])
    assert '"get_weather"' in head and '"get_time"' in head, "the tools are not before the conversation"
    assert common_prefix_len(ids1, ids2) >= before, "the prefix before the new turn changed between the calls"
    assert cached >= before, f"{cached} of the {before} tokens before the new turn were cached"
    assert_no_leak(client)


def test_a_tool_loop_caches_the_conversation_before_its_new_turns(sdk: openai.OpenAI, served: Served) -> None:
    """The agent calls a tool, gets its result, answers; each call caches all of the previous one's
    prompt (the system prompt, the tools and the turns so far)."""
    messages = [{"role": "system", "content": SYSTEM + " (loop)"}, {"role": "user", "content": "Weather in Oslo?"}]
    ids1, _, _ = _call(sdk, served, messages, "required", False)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city":"Oslo","days":1}'}}
    messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."}]
    ids2, cached, _ = _call(sdk, served, messages, "auto", False)
    before = _turn_start(ids2, "assistant", '{"name":"get_weather"')
    assert common_prefix_len(ids1, ids2) >= before and cached >= before


def test_declared_fixed_prefix_covers_the_tools(sdk: openai.OpenAI, served: Served) -> None:
    hint = {"workflow_id": "wf-tools", "agent": "triage", "steps": {"triage": 0}, "fixed_prefix": 1}
    question = "Weather in Oslo?"
    for messages in ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     [{"role": "user", "content": question}]):  # no system prompt: the tools open the prompt
        fixed = hint if messages[0]["role"] == "system" else {**hint, "fixed_prefix": 0}
        ids, _, _ = _call(sdk, served, messages, "auto", False, extra_body={"custom_params": {"kvflow": fixed}})
        greq = served.requests[-1][1]
        assert greq.fixed_prefix_tokens == _turn_start(ids, "user", question), \
            "the fixed prefix stops short of the tools"


def test_learned_fixed_prefix_covers_the_tools(sdk: openai.OpenAI, served: Served) -> None:
    """Without a declared boundary the brain tags what an agent's calls share (its shared-prefix
    rule, run here on the prompts the server built): the system prompt and the tools."""
    hint = KVFlowHint(workflow_id="wf-learn", agent="triage", steps={"triage": 0})
    intake: RequestIntake[Any] = RequestIntake(CacheConfig(device_tokens=4096))
    for turn in ("Weather in Oslo?", "Weather in Lima, please?"):
        ids, _, _ = _call(sdk, served, [{"role": "system", "content": SYSTEM + " (learned)"},
                                        {"role": "user", "content": turn}], "auto", False,
                          extra_body={"custom_params": {"kvflow": hint.model_dump(exclude_none=True)}})
        decision = intake.accept(AgentRequest(ids, served.requests[-1][1].hint))
    assert decision.fixed_tokens >= _turn_start(ids, "user", turn) > 0


def _reply(message: Any) -> Any:
    if isinstance(message, tuple):  # a stream's text and call deltas
        text, calls = message
        return text, "".join(f"{c.name or ''}{c.arguments or ''}" for c in calls)
    calls = message.tool_calls or []
    return message.content, "".join(f"{c.function.name}{c.function.arguments}" for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_greedy_replies_are_the_same_cold_and_cached(sdk: openai.OpenAI, served: Served, stream: bool) -> None:
    system = {"role": "system", "content": SYSTEM + f" (greedy {stream})"}
    first = [system, {"role": "user", "content": "Weather in Oslo?"}]
    second = [system, {"role": "user", "content": "Weather in Lima, in three days?"}]
    replies = {}
    for choice in ("auto", "required", NAMED):
        _call(sdk, served, first, choice, stream)
        _, cached, warm = _call(sdk, served, second, choice, stream)
        assert cached > 0
        replies[json.dumps(choice)] = _reply(warm)
    with start_server() as cold_server:
        cold_sdk = openai.OpenAI(base_url=cold_server.url + "/v1", api_key="unused", max_retries=0)
        for choice in ("auto", "required", NAMED):
            _, cached, cold = _call(cold_sdk, cold_server, second, choice, stream)
            if choice == "auto":
                assert cached == 0
            assert _reply(cold) == replies[json.dumps(choice)], choice
