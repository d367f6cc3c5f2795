"""OpenAI-exact behaviour against the real server (tiny-random, 127.0.0.1): the official SDK's
exception classes, ``models.retrieve``, the error shape with ``param``, ``Allow`` on 405, ``HEAD``
where ``GET`` exists, ``/openapi.json`` documenting every route and the hint, forward-compatible hints."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from server_helpers import DEVICE_TOKENS, Served, assert_no_leak

USER = [{"role": "user", "content": "hi"}]
TOO_LONG = [{"role": "user", "content": "word " * (DEVICE_TOKENS * 2)}]


@pytest.fixture
def sdk(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_sdk_raises_bad_request_for_too_long_input(sdk: openai.OpenAI, client: httpx.Client) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="tiny-random", messages=TOO_LONG, max_tokens=4)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model="tiny-random", prompt="word " * (DEVICE_TOKENS * 2), max_tokens=4)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "prompt"
    # max_tokens alone over the context is the same error
    with pytest.raises(openai.BadRequestError, match="KV slots"):
        sdk.chat.completions.create(model="tiny-random", messages=USER, max_tokens=DEVICE_TOKENS * 2)
    assert_no_leak(client)


def test_sdk_raises_not_found_for_an_unknown_model_and_retrieves_the_served_one(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="gpt-9", messages=USER, max_tokens=2)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    model = sdk.models.retrieve("tiny-random")
    assert model.id == "tiny-random" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-9")
    assert [m.id for m in sdk.models.list()] == ["tiny-random"]


@pytest.mark.parametrize("body, param", [
    ({"messages": USER, "seed": 2**64}, "seed"),
    ({"messages": USER, "temperature": -1}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": USER, "max_tokens": 10**9}, "max_tokens"),
    ({"messages": USER, "logit_bias": {"x": 1}}, "logit_bias"),
    ({"messages": USER, "custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}},
     "custom_params.kvflow"),
])
def test_errors_name_the_field_in_param(client: httpx.Client, body: dict, param: str) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert error["param"] == param and isinstance(error["code"], str), error


def test_a_bad_generate_hint_names_its_own_placement(client: httpx.Client) -> None:
    body = {"text": "a", "sampling_params": {"custom_params": {"kvflow": {"workflow_id": "w", "agent": ""}}}}
    error = client.post("/generate", json=body).json()["error"]
    assert error["param"] == "sampling_params.custom_params.kvflow" and error["code"] == "invalid_hint"


def test_routing_errors_have_string_codes_and_405_names_allowed_methods(client: httpx.Client) -> None:
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    r = client.delete("/health")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/v1/models/tiny-random", "/kvflow/v1/info",
                                  "/kvflow/v1/stats", "/metrics", "/openapi.json"])
def test_head_answers_wherever_get_does(client: httpx.Client, path: str) -> None:
    r = client.head(path)
    assert r.status_code == 200 and r.content == b""


def test_openapi_documents_every_route_and_the_hint(client: httpx.Client, served: Served) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model_id}", "/generate",
                 "/kvflow/v1/info", "/kvflow/v1/steps", "/kvflow/v1/stats", "/health", "/metrics"]:
        assert path in paths, path
    schemas = spec["components"]["schemas"]
    assert set(schemas["KVFlowHint"]["properties"]) >= {"workflow_id", "agent", "steps", "fixed_prefix"}
    chat = schemas[paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
                   ["$ref"].rsplit("/", 1)[1]]
    hint_ref = chat["properties"]["custom_params"]["anyOf"][0]["properties"]["kvflow"]["$ref"]
    assert hint_ref.endswith("/KVFlowHint")
    assert {"logprobs", "top_logprobs", "logit_bias", "n", "presence_penalty"} <= set(chat["properties"])


def test_unknown_hint_fields_are_ignored_with_a_warning_known_ones_still_checked(
        client: httpx.Client, served: Served, caplog: pytest.LogCaptureFixture) -> None:
    hint = {"workflow_id": "w-fc", "agent": "a", "steps": {"a": 0}, "priority": 3, "future": {"x": 1}}
    with caplog.at_level(logging.WARNING, logger="kvflow.protocol"):
        r = client.post("/v1/chat/completions",
                        json={"messages": USER, "max_tokens": 2, "custom_params": {"kvflow": hint}})
    assert r.status_code == 200, r.text
    assert served.requests[-1][1].hint is not None and served.requests[-1][1].hint.agent == "a"
    assert any("future, priority" in rec.getMessage() for rec in caplog.records)
    bad = {**hint, "steps": {"a": "soon"}}
    r = client.post("/v1/chat/completions", json={"messages": USER, "custom_params": {"kvflow": bad}})
    assert r.status_code == 400 and "steps.a" in r.json()["error"]["message"]
