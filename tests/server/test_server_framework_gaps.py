"""Regression tests for the server-side gaps agent frameworks hit (issue 25), each on the real
server (tiny-random engine) with the bodies those frameworks send: ``$ref`` in tool parameters,
``null`` meaning the default, a small ``max_tokens`` with tools or a JSON format, the advertised
context, schema keywords constrained decoding cannot enforce, legacy ``function`` messages,
``top_p: 0``, empty stop strings, and OpenAI's error contract."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from server_helpers import DEVICE_TOKENS, Served, assert_no_leak

USER = [{"role": "user", "content": "Plan a trip."}]
# What pydantic writes for a model with a nested model field (the nested one under $defs).
NESTED = {"$defs": {"Place": {"properties": {"city": {"title": "City", "type": "string", "maxLength": 10},
                                             "days": {"title": "Days", "type": "integer"}},
                              "required": ["city", "days"], "title": "Place", "type": "object"}},
          "properties": {"place": {"$ref": "#/$defs/Place"},
                         "note": {"title": "Note", "type": "string", "maxLength": 8}},
          "required": ["place", "note"], "title": "Trip", "type": "object"}
TRIP = {"type": "function", "function": {"name": "plan_trip", "parameters": NESTED}}


def chat(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, **body})


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_refs_in_tool_parameters_resolve_against_the_tool_schema(client: httpx.Client) -> None:
    for stream in (False, True):
        if not stream:
            choice = ok(chat(client, tools=[TRIP], tool_choice="required"))
            args = choice["message"]["tool_calls"][0]["function"]["arguments"]
        else:
            with client.stream("POST", "/v1/chat/completions", json={"messages": USER, "temperature": 0, "stream": True,
                                                                     "tools": [TRIP], "tool_choice": "required"}) as r:
                assert r.status_code == 200, r.read()
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            args = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                           for c in chunks if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
        jsonschema.validate(json.loads(args), NESTED)
    # the same schema as response_format still works
    choice = ok(chat(client, response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": NESTED}}))
    jsonschema.validate(json.loads(choice["message"]["content"]), NESTED)


@pytest.mark.parametrize("field", ["temperature", "top_p", "n", "stream", "presence_penalty", "frequency_penalty"])
def test_null_means_the_default(client: httpx.Client, served: Served, field: str) -> None:
    r = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, field: None})
    choice = ok(r)
    # the default temperature samples: the random model may draw its end token within the 2 tokens
    assert choice["finish_reason"] in ("length", "stop") and r.json()["usage"]["completion_tokens"] <= 2
    sampling = served.requests[-1][1].sampling
    defaults = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    if field in defaults:
        assert getattr(sampling, field) == defaults[field]


@pytest.mark.parametrize("extra", [
    {"tools": [TRIP], "tool_choice": "required"},
    {"tools": [TRIP]},  # auto
    {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": NESTED}}},
    {"response_format": {"type": "json_object"}},
], ids=["tools-required", "tools-auto", "json-schema", "json-object"])
@pytest.mark.parametrize("stream", [False, True])
def test_small_max_tokens_with_a_format_truncates_on_length(client: httpx.Client, extra: dict, stream: bool) -> None:
    body = {"messages": USER, "temperature": 0, "max_tokens": 1, **extra}
    if not stream:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 1
    else:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert_no_leak(client)


def test_advertised_context_is_the_one_that_holds(client: httpx.Client) -> None:
    info = client.get("/kvflow/v1/info").json()
    (card,) = client.get("/v1/models").json()["data"]
    assert info["context_length"] == card["max_model_len"] == DEVICE_TOKENS
    assert client.get(f"/v1/models/{card['id']}").json()["max_model_len"] == DEVICE_TOKENS
    prompt = [10 + i % 200 for i in range(DEVICE_TOKENS - 4)]
    fits = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5, "temperature": 0})  # 1024 slots
    assert fits.status_code == 200, fits.text
    over = client.post("/v1/completions", json={"prompt": prompt + [10], "max_tokens": 5})
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"


UNENFORCEABLE = [
    ("not", {"type": "object", "properties": {"a": {"not": {"type": "string"}}}, "required": ["a"]}),
    ("uniqueItems", {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"},
                                                            "uniqueItems": True}}, "required": ["a"]}),
    ("allOf", {"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
               "required": ["a"]}),
    ("$ref", {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]}),
    ("$ref", {"$ref": "#"}),
]


@pytest.mark.parametrize("keyword,schema", UNENFORCEABLE, ids=[f"{k}-{i}" for i, (k, _) in enumerate(UNENFORCEABLE)])
@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_unenforceable_schema_is_a_400_naming_it(client: httpx.Client, keyword: str, schema: dict, where: str) -> None:
    if where == "tools":
        body = {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                "tool_choice": "required"}
        param = "tools.0.function.parameters"
    else:
        body = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
        param = "response_format.json_schema.schema"
    r = chat(client, temperature=1.0, max_tokens=40, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and keyword in error["message"], error
    assert_no_leak(client)


def test_legacy_function_messages_are_read_as_tool_results(client: httpx.Client, served: Served) -> None:
    history = USER + [
        {"role": "assistant", "content": None, "function_call": {"name": "plan_trip", "arguments": '{"note":"x"}'}},
        {"role": "function", "name": "plan_trip", "content": "booked"},
    ]
    ok(client.post("/v1/chat/completions", json={"messages": history, "max_tokens": 2}))
    modern = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "plan_trip", "arguments": '{"note":"x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "booked"},
    ]
    legacy_ids = served.requests[-1][1].input_ids
    ok(client.post("/v1/chat/completions", json={"messages": modern, "max_tokens": 2}))
    assert served.requests[-1][1].input_ids == legacy_ids


def test_top_p_zero_is_greedy(client: httpx.Client) -> None:
    greedy = ok(chat(client, max_tokens=8, temperature=0))["message"]["content"]
    top_p_zero = ok(chat(client, max_tokens=8, temperature=1.0, top_p=0, seed=3))["message"]["content"]
    assert top_p_zero == greedy


@pytest.mark.parametrize("stop", [[""], "", ["END", ""]])
def test_empty_stop_strings_are_refused_as_vllm_refuses_them(client: httpx.Client, stop) -> None:
    r = chat(client, max_tokens=8, stop=stop)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text


@pytest.mark.parametrize("body,param", [
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"temperature": 5}, "temperature"),
])
def test_invalid_fields_are_400_with_param(client: httpx.Client, body: dict, param: str) -> None:
    r = client.post("/v1/chat/completions", json={"messages": USER, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


@pytest.mark.parametrize("body,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TRIP], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools"),
])
def test_schema_and_tool_choice_errors_name_the_field_without_xgrammar_internals(client: httpx.Client, body: dict,
                                                                                param: str) -> None:
    r = chat(client, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert ".cc:" not in error["message"] and not re.search(r"\[\d\d:\d\d:\d\d\]", error["message"]), error["message"]


def test_nan_temperature_is_answered_about_nan(client: httpx.Client) -> None:
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    message = r.json()["error"]["message"]
    assert "NaN" in message and "less than" not in message, message
