"""Hypothesis fuzzes the bodies of ``/v1/chat/completions``, ``/generate`` and ``/kvflow/v1/steps``:
near-valid shapes with wrong types, out-of-range numbers and hostile hints, arbitrary JSON, and raw
bytes. Every answer must be a 2xx (SSE streams end with ``[DONE]``) or a 4xx carrying the JSON error
shape, never a 5xx, a hang or a dropped connection; afterwards the server still answers, no request
holds a slot and the cache passes its integrity check."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.server import ServerLimits
from kvflow_live import Live, integrity, live_server, wait_idle

leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
                 st.text(max_size=20))
any_json = st.recursive(leaf,
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=3),
                        max_leaves=8)
def mostly(valid: st.SearchStrategy[Any], *invalid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid values nine times in ten, so requests get past validation often enough to reach the engine."""
    bad = st.one_of(any_json, *invalid)
    return st.integers(0, 9).flatmap(lambda roll: bad if roll == 0 else valid)


name = mostly(st.text(min_size=1, max_size=12), st.text(max_size=0))
steps = mostly(st.dictionaries(st.text(min_size=1, max_size=6), st.integers(0, 9) | st.none(), max_size=4),
               st.dictionaries(st.text(max_size=6), st.integers(-3, 9) | any_json, max_size=4))
hint = st.fixed_dictionaries({"workflow_id": name, "agent": name},
                             optional={"namespace": name, "steps": steps,
                                       "fixed_prefix": mostly(st.integers(0, 2), st.integers(-2, 4)),
                                       "extra": any_json})
custom = mostly(st.fixed_dictionaries({"kvflow": hint}))
max_tokens = mostly(st.integers(1, 6), st.integers(-3, 40))
message = st.fixed_dictionaries({"role": mostly(st.sampled_from(["system", "user", "assistant"]), st.just("wizard")),
                                 "content": mostly(st.text(max_size=60))})

chat_body = st.fixed_dictionaries(
    {"messages": mostly(st.lists(message, min_size=1, max_size=3), st.just([])), "max_tokens": max_tokens},
    optional={"temperature": mostly(st.floats(0, 2), st.floats(-1, 3)),
              "top_p": mostly(st.floats(0.01, 1), st.floats(-1, 2)), "stream": mostly(st.booleans()),
              "stop": mostly(st.lists(st.text(min_size=1, max_size=4), max_size=3)),
              "seed": mostly(st.integers(0, 2**31), st.integers(-5, 2**70)),
              "model": mostly(st.just("tiny-random"), name), "custom_params": custom},
)
sampling_params = st.fixed_dictionaries(
    {"max_new_tokens": max_tokens},
    optional={"temperature": mostly(st.floats(0, 2), st.floats(-1, 3)), "ignore_eos": mostly(st.booleans()),
              "custom_params": custom, "stop": any_json})
prompt = mostly(st.fixed_dictionaries({"text": st.text(min_size=1, max_size=60)}),
                st.fixed_dictionaries({"input_ids": st.lists(st.integers(-5, 300), max_size=20)}),
                st.fixed_dictionaries({"text": any_json, "input_ids": any_json}))
generate_body = st.builds(
    lambda p, extra: {**(p if isinstance(p, dict) else {"text": p}), **extra},
    mostly(prompt, st.just({}))
    | st.fixed_dictionaries({"input_ids": st.lists(st.integers(0, 258), min_size=1, max_size=20)}),
    st.fixed_dictionaries({"sampling_params": mostly(sampling_params)}, optional={"stream": mostly(st.booleans())}),
)
steps_body = st.fixed_dictionaries({"workflow_id": name}, optional={"namespace": name, "steps": steps,
                                                                    "done": mostly(st.booleans())})


def encoded(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    as_json = strategy.map(lambda body: json.dumps(body).encode())  # NaN/Infinity tokens included: not JSON
    return st.one_of(as_json, as_json, as_json, st.binary(max_size=80))


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_server(limits=ServerLimits(max_tokens=6)) as served:
        yield served


@pytest.fixture(scope="module")
def client(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def check_answer(response: httpx.Response, body: bytes) -> None:
    status = response.status_code
    assert 200 <= status < 300 or 400 <= status < 500, (status, body[:300], response.text[:300])
    if status >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"], response.text
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.rstrip().endswith("data: [DONE]"), response.text[-200:]
    else:
        assert isinstance(response.json(), dict)


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                database=None)


@pytest.mark.parametrize("route, strategy", [("/v1/chat/completions", chat_body), ("/generate", generate_body),
                                             ("/kvflow/v1/steps", steps_body)],
                         ids=["chat", "generate", "steps"])
def test_fuzzed_bodies_get_2xx_or_json_4xx_and_the_server_survives(client: httpx.Client, route: str, strategy) -> None:
    @FUZZ
    @given(body=encoded(strategy))
    def run(body: bytes) -> None:
        check_answer(client.post(route, content=body, headers={"content-type": "application/json"}), body)

    run()
    assert client.get("/health").json() == {"status": "ok"}
    ok = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text
    wait_idle(client)
    assert integrity(client)["ok"]


async def test_extreme_temperatures_are_served_beside_normal_requests(live: Live) -> None:
    # Regression (found by the chat fuzz): temperature 3e-121 made every scaled logit +-inf, softmax NaN,
    # multinomial raise: a 500, and when it happened at decode the exception escaped the batch loop so
    # the whole decode batch failed again on every step, forever.
    import asyncio

    async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
        async def chat(temperature: float) -> httpx.Response:
            return await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"t={temperature}"}], "max_tokens": 6,
                "temperature": temperature, "seed": 1})

        answers = await asyncio.gather(*(chat(t) for t in (1e-300, 2.986e-121, 1e-9, 0.0, 0.7, 2.0)))
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    with httpx.Client(base_url=live.url, timeout=30) as client:
        wait_idle(client)
