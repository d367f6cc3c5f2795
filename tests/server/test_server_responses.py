"""``POST /v1/responses`` on the real server (tiny-random engine), driven by the official OpenAI SDK
as an app would: text replies, instructions, tool calls and their outputs in the input, structured
output through ``text.format``, streaming through ``responses.create(stream=True)`` and the SDK's
``responses.stream()`` helper (which checks the event order), the hint, and a clear 400 naming
every field this server does not serve."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from server_helpers import Served, assert_no_leak

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"$ref": "#/$defs/City"}, "days": {"type": "integer"}},
                          "required": ["city", "days"], "additionalProperties": False,
                          "$defs": {"City": {"type": "string", "maxLength": 12}}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture
def sdk(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_text_reply_with_instructions_has_the_response_shape(sdk: openai.OpenAI, served: Served) -> None:
    out = sdk.responses.create(model="tiny-random", instructions="You are terse.", input="Say hi.",
                               max_output_tokens=6, temperature=0)
    assert out.object == "response" and out.id.startswith("resp_")
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    (item,) = out.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert out.output_text == item.content[0].text
    assert out.usage.output_tokens == 6 and out.usage.input_tokens > 6
    route, greq = served.requests[-1]
    assert route == "responses" and greq.sampling.max_tokens == 6 and greq.sampling.temperature == 0
    # the instructions are the conversation's first (system) message
    plain = sdk.chat.completions.create(model="tiny-random", max_tokens=6, temperature=0,
                                        messages=[{"role": "system", "content": "You are terse."},
                                                  {"role": "user", "content": "Say hi."}])
    assert plain.choices[0].message.content == out.output_text


def test_forced_tool_call_then_its_output_continues_the_conversation(sdk: openai.OpenAI) -> None:
    out = sdk.responses.create(model="tiny-random", input="Weather in Oslo?", tools=[WEATHER],
                               tool_choice="required", temperature=0)
    (call,) = out.output
    assert out.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])  # $ref resolved in the tool's own schema
    follow = sdk.responses.create(model="tiny-random", tools=[WEATHER], tool_choice="none", max_output_tokens=4,
                                  input=[{"role": "user", "content": "Weather in Oslo?"},
                                         call.model_dump(exclude_none=True),
                                         {"type": "function_call_output", "call_id": call.call_id, "output": "rainy"}])
    assert follow.output[0].type == "message"


def test_structured_output_through_text_format_validates(sdk: openai.OpenAI) -> None:
    out = sdk.responses.create(model="tiny-random", input="Describe Ada.", temperature=1.0,
                               text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                "strict": True}})
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), PERSON)


def test_streamed_events_reassemble_to_the_plain_reply(sdk: openai.OpenAI) -> None:
    body = dict(model="tiny-random", input="Weather in Oslo?", tools=[WEATHER], tool_choice="required", temperature=0)
    whole = sdk.responses.create(**body).output[0]
    events = list(sdk.responses.create(**body, stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response.output[0]
    assert pieces == final.arguments == whole.arguments and final.name == whole.name
    # the SDK's own stream helper, which tracks every item and part the events announce
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    with sdk.responses.stream(model="tiny-random", input="Describe Ada.", text=fmt, temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        done = stream.get_final_response()
    assert done.output_text == text and done.status == "completed"
    jsonschema.validate(json.loads(text), PERSON)
    cut = list(sdk.responses.create(model="tiny-random", input="Say hi.", max_output_tokens=3, stream=True))
    assert cut[-1].type == "response.incomplete" and cut[-1].response.incomplete_details.reason == "max_output_tokens"


def test_hint_rides_as_on_the_chat_route_and_info_names_it(sdk: openai.OpenAI, served: Served,
                                                           client: httpx.Client) -> None:
    assert client.get("/kvflow/v1/info").json()["hints"]["responses"] == ["custom_params.kvflow"]
    hint = {"workflow_id": "wf-r", "agent": "writer", "steps": {"writer": 0, "critic": 1}, "fixed_prefix": 1}
    sdk.responses.create(model="tiny-random", instructions="You write.", input="Go.", max_output_tokens=2,
                         extra_body={"custom_params": {"kvflow": hint}})
    greq = served.requests[-1][1]
    assert greq.hint is not None and greq.hint.agent == "writer" and greq.hint.steps == {"writer": 0, "critic": 1}
    assert greq.fixed_prefix_tokens is not None and 0 < greq.fixed_prefix_tokens < len(greq.input_ids)


@pytest.mark.parametrize("extra,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"tools": [{"type": "web_search"}]}, "tools.0"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x",
                          "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}},
     "text.format.schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
])
def test_what_is_not_served_is_a_400_naming_the_field(client: httpx.Client, extra: dict, param: str) -> None:
    r = client.post("/v1/responses", json={"model": "tiny-random", "input": "hi", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param), error
    assert param.split(".")[0] in error["message"]
    assert_no_leak(client)
