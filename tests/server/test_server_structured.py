"""Structured output and tools on the real server (tiny-random engine, uvicorn on 127.0.0.1): every
constrained reply parses and validates, tool calls have OpenAI's shape in replies and in stream
deltas, ``/generate`` enforces SGLang's ``json_schema`` / ``regex`` / ``ebnf``, and contradictory or
invalid requests are a 400 naming the problem (a budget too small to finish is truncated: see
test_server_framework_gaps.py)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from server_helpers import assert_no_leak

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0},
        "mood": {"enum": ["happy", "sad"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                    "additionalProperties": False},
    },
    "required": ["name", "age", "mood", "tags", "address"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "Tell me about Ada."}]


def valid(obj, schema=SCHEMA) -> bool:
    jsonschema.validate(obj, schema)
    return True


def chat(client, **body):
    r = client.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def sse(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("max_tokens", [80, 256])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_json_schema_reply_always_validates(client, max_tokens, temperature):
    choice = chat(client, max_tokens=max_tokens, temperature=temperature, seed=7,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}})
    assert choice["finish_reason"] == "stop"
    assert valid(json.loads(choice["message"]["content"]))


def test_json_object_reply_is_an_object(client):
    choice = chat(client, max_tokens=30, response_format={"type": "json_object"})
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_unconstrained_greedy_output_is_unchanged_by_the_constraint_machinery(client):
    plain = chat(client, max_tokens=12)
    text = chat(client, max_tokens=12, response_format={"type": "text"})
    assert plain["message"]["content"] == text["message"]["content"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_has_openai_shape(client, choice):
    out = chat(client, tools=[WEATHER, CLOCK] if choice == "required" else [WEATHER], tool_choice=choice)
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    (call,) = out["message"]["tool_calls"]
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"]) and call["type"] == "function"
    assert call["function"]["name"] in {"get_weather", "get_time"}
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        assert valid(args, WEATHER["function"]["parameters"])


def test_auto_is_either_text_or_a_call(client):
    out = chat(client, tools=[WEATHER], tool_choice="auto", max_tokens=64)
    message = out["message"]
    if message.get("tool_calls"):
        assert out["finish_reason"] == "tool_calls" and message["content"] is None
    else:
        assert isinstance(message["content"], str) and out["finish_reason"] == "stop"


def test_tool_choice_none_is_plain_text_and_history_with_calls_is_accepted(client, served):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy"},
    ]
    r = client.post("/v1/chat/completions", json={"messages": history, "tools": [WEATHER], "tool_choice": "none",
                                                  "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    assert "tool_calls" not in r.json()["choices"][0]["message"]
    assert served.requests[-1][1].constraint is None


def test_streamed_tool_call_deltas_reassemble_to_the_plain_reply(client):
    body = {"messages": USER, "temperature": 0, "tools": [WEATHER], "tool_choice": "required"}
    whole = chat(client, tools=[WEATHER], tool_choice="required")["message"]["tool_calls"][0]
    chunks = sse(client, "/v1/chat/completions", {**body, "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert len(calls) > 2, calls  # the name first, then argument pieces as they were generated
    head = calls[0]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"]["name"] == "get_weather"
    assert all("id" not in c and "name" not in c["function"] for c in calls[1:])
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert arguments == whole["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("field,spec,check", [
    ("json_schema", json.dumps(SCHEMA), lambda text: valid(json.loads(text))),
    ("regex", r"(yes|no), [0-9]{3}", lambda text: re.fullmatch(r"(yes|no), [0-9]{3}", text)),
    ("ebnf", 'root ::= "The answer is " ("red" | "blue") "."', lambda text: text in ("The answer is red.",
                                                                                    "The answer is blue.")),
])
def test_generate_enforces_sglang_constraints(client, field, spec, check):
    r = client.post("/generate", json={"text": "Answer:", "sampling_params": {
        "max_new_tokens": 128, "temperature": 0, field: spec}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert check(out["text"]), out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("path,body,fragment", [
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice: set without tools"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "no tool named 'nope'"),
    ("/v1/chat/completions", {"tools": [WEATHER], "response_format": {"type": "json_object"}},
     "response_format: cannot be combined with tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "p",
                              "schema": {"type": "nonsense"}}}}, "invalid json_schema"),
    ("/generate", {"regex": "[a-"}, "invalid regex"),
    ("/generate", {"ebnf": "root ::= "}, "invalid ebnf"),
    ("/generate", {"json_schema": "{not json"}, "invalid json_schema"),
])
def test_bad_constraints_are_a_400_naming_the_problem(client, path, body, fragment):
    if path == "/generate":
        r = client.post(path, json={"text": "x", "sampling_params": body})
    else:
        r = client.post(path, json={"messages": USER, **body})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]
    assert_no_leak(client)


def test_generate_refuses_two_constraints(client):
    r = client.post("/generate", json={"text": "x", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}})
    assert r.status_code == 400 and "only one of json_schema, regex and ebnf" in r.text


def test_openai_sdk_parse_and_tools(served):
    openai = pytest.importorskip("openai")
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population: int

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    parsed = client.chat.completions.parse(model="tiny-random", messages=USER, response_format=City, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, City)
    out = client.chat.completions.create(model="tiny-random", messages=USER, tools=[WEATHER], tool_choice="required")
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    json.loads(call.function.arguments)
