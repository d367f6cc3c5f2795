"""The sampling fields the OpenAI routes accept all reach the engine and show in the answer:
logprobs / top_logprobs (chat, completions, streamed), n > 1, penalties, logit_bias, top_k, min_p;
through the official SDK and raw HTTP against the real server."""

from __future__ import annotations

import json

import httpx
import openai

from server_helpers import Served, assert_no_leak

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]


def _events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.split("\n\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_chat_logprobs_through_the_sdk(served: Served) -> None:
    sdk = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    reply = sdk.chat.completions.create(model="tiny-random", messages=MESSAGES, max_tokens=5, temperature=0,
                                        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 5
    assert "".join(item.token for item in content) == reply.choices[0].message.content
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob == item.logprob  # greedy picks the most likely token
        assert bytes(item.bytes) == item.token.encode()


def test_streamed_chat_logprobs_equal_the_plain_ones(client: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2,
            "ignore_eos": True}
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    chunks = _events(client.post("/v1/chat/completions", json={**body, "stream": True}))
    streamed = [item for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for item in c["choices"][0]["logprobs"]["content"]]
    assert streamed == plain


def test_completions_logprobs_in_the_legacy_shape(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4, "temperature": 0,
                                             "logprobs": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"][0] == 0 and all(len(top) <= 2 for top in lp["top_logprobs"])
    assert client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2}).json()["choices"][0][
        "logprobs"] is None


def test_n_choices_are_independent_samples(client: httpx.Client, served: Served) -> None:
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 3, "ignore_eos": True}
    data = client.post("/v1/chat/completions", json=body).json()
    choices = data["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) > 1
    assert data["usage"]["completion_tokens"] == 24
    seeds = [req.sampling.seed for _, req in served.requests[-3:]]
    assert seeds == [11, 12, 13]
    # seeded: the same request gives the same three choices
    again = client.post("/v1/chat/completions", json=body).json()["choices"]
    assert [c["message"]["content"] for c in again] == [c["message"]["content"] for c in choices]
    greedy = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0, "n": 2}).json()
    assert greedy["choices"][0]["text"] == greedy["choices"][1]["text"]
    assert_no_leak(client)


def test_every_sampling_field_reaches_the_engine(client: httpx.Client, served: Served) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.3, "logit_bias": {"7": -100, "9": 2.5}, "top_k": 5, "min_p": 0.1}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    sampling = served.requests[-1][1].sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (0.5, -0.5, 1.3)
    assert dict(sampling.logit_bias) == {7: -100.0, 9: 2.5}
    assert (sampling.top_k, sampling.min_p, sampling.logprobs) == (5, 0.1, None)
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"top_k": 5, "min_p": 0.1,
                                                                         "presence_penalty": 1.0, "max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert (served.requests[-1][1].sampling.top_k, served.requests[-1][1].sampling.presence_penalty) == (5, 1.0)


def test_logit_bias_changes_the_reply(client: httpx.Client) -> None:
    body = {"prompt": "Hi", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    forced = client.post("/v1/completions", json={**body, "logit_bias": {"70": 100}}).json()["choices"][0]["text"]
    one = client.post("/v1/completions", json={
        "prompt": [70] * 4, "max_tokens": 1, "temperature": 0, "logit_bias": {"70": 100}}).json()["choices"][0]["text"]
    assert forced != plain and forced == one * 4
