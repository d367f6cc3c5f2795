"""Client input that used to reach the engine as a 500 (issue 28) gets a 4xx naming the field, and
loosely typed hint fields are refused rather than coerced (``done: "yes"`` used to end a workflow)."""

from __future__ import annotations

import json

import httpx
import pytest

from server_helpers import Served, assert_no_leak

HUGE = "1" + "0" * 400  # a JSON integer past float's range
JSON = {"content-type": "application/json"}


def _hinted(steps: str = '{"qa": 1}', extra: str = "") -> str:
    hint = f'{{"workflow_id": "wf-huge", "agent": "qa", "steps": {steps}{extra}}}'
    return f'{{"prompt": "hello there", "max_tokens": 2, "custom_params": {{"kvflow": {hint}}}}}'


def test_a_huge_integer_step_is_a_4xx_naming_the_field(served: Served, client: httpx.Client) -> None:
    seen = len(served.requests), len(served.steps)
    r = client.post("/kvflow/v1/steps", content=f'{{"workflow_id": "w", "steps": {{"coder": {HUGE}}}}}', headers=JSON)
    assert r.status_code == 422, r.text
    assert "steps.coder" in r.json()["error"]["message"] and "past the largest number" in r.json()["error"]["message"]
    r = client.post("/v1/completions", content=_hinted(f'{{"qa": {HUGE}}}'), headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "custom_params.kvflow" and "steps.qa" in error["message"]
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 2, "custom_params": {"kvflow": {
        "workflow_id": "w", "agent": "qa", "steps": {"qa": "HUGE"}}}}}
    r = client.post("/generate", content=json.dumps(body).replace('"HUGE"', HUGE), headers=JSON)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.custom_params.kvflow"
    assert (len(served.requests), len(served.steps)) == seen
    assert_no_leak(client)


@pytest.mark.parametrize("done", ['"yes"', '"off"', "1", '"1"', "0"])
def test_done_that_is_not_a_boolean_is_refused_and_ends_nothing(served: Served, client: httpx.Client,
                                                                 done: str) -> None:
    seen = len(served.steps)
    r = client.post("/kvflow/v1/steps", content=f'{{"workflow_id": "w-strict", "done": {done}}}', headers=JSON)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "done" and "valid boolean" in error["message"]
    assert len(served.steps) == seen  # the update never reached the hint table


@pytest.mark.parametrize("fixed", ['"1"', "true", "1.0"])
def test_fixed_prefix_that_is_not_an_integer_is_refused(served: Served, client: httpx.Client, fixed: str) -> None:
    seen = len(served.requests)
    r = client.post("/v1/completions", content=_hinted(extra=f', "fixed_prefix": {fixed}'), headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_hint" and "fixed_prefix" in error["message"]
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "max_tokens": 2, "custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "fixed_prefix": "F"}}}
    r = client.post("/v1/chat/completions", content=json.dumps(chat).replace('"F"', fixed), headers=JSON)
    assert r.status_code == 400 and "fixed_prefix" in r.json()["error"]["message"]
    assert len(served.requests) == seen


# A grammar that accepts nothing would leave no token to sample: at temperature 1 the masked
# distribution is all -inf, and torch.multinomial fails on its NaN probabilities.
SELF_REFERENCING = [{"$ref": "#"}, {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
                    {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}]


@pytest.mark.parametrize("schema", SELF_REFERENCING)
def test_a_schema_no_value_satisfies_is_a_400_on_every_route(served: Served, client: httpx.Client,
                                                             schema: dict) -> None:
    seen = len(served.requests)
    messages = [{"role": "user", "content": "give me json"}]
    chat = {"messages": messages, "max_tokens": 8, "temperature": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "loop", "schema": schema}}}
    tools = {"messages": messages, "max_tokens": 8, "temperature": 1, "tool_choice": "required",
             "tools": [{"type": "function", "function": {"name": "loop", "parameters": schema}}]}
    responses = {"input": "give me json", "max_output_tokens": 8, "temperature": 1,
                 "text": {"format": {"type": "json_schema", "name": "loop", "schema": schema}}}
    generate = {"text": "give me json", "sampling_params": {"max_new_tokens": 8, "temperature": 1,
                                                            "json_schema": json.dumps(schema)}}
    for route, body, param in [("/v1/chat/completions", chat, "response_format.json_schema.schema"),
                               ("/v1/chat/completions", tools, "tools.0.function.parameters"),
                               ("/v1/responses", responses, "text.format.schema"),
                               ("/generate", generate, "sampling_params.json_schema")]:
        r = client.post(route, json=body)
        assert r.status_code == 400, (route, r.status_code, r.text)
        error = r.json()["error"]
        assert error["code"] == "unsupported_schema" and error["param"] == param, (route, error)
        assert "no finite JSON value satisfies" in error["message"]
    assert len(served.requests) == seen
    assert_no_leak(client)
