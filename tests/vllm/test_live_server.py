"""``kvflow serve --engine vllm`` on SmolLM2 with a small KV pool (one server for the module):
hints in ``custom_params.kvflow`` reach the scheduler, the fixed prompt of a hinted agent outlives
untagged prefixes in vLLM's own prefix cache, a plain agent's conversation outlives other traffic
across its tool call (continuations), greedy output never depends on the cache, and the
/kvflow/v1 routes answer (bad input with a 4xx naming the problem)."""

from __future__ import annotations

import json
import uuid
from typing import Iterator, TypedDict

import httpx
import pytest

from vllm_server import HAVE_VLLM, SKIP_REASON, export_smollm2, vllm_server

from backends.vllm_kvflow import CONFIG_ENV
from kvflow_orch.protocol import KVFlowHint, attach_hint

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON), pytest.mark.timeout(1200)]

BLOCK = 128
POOL_TOKENS = 15 * BLOCK  # 15 usable blocks (the launcher adds vLLM's null block)
COLD_HOLD_S = 600  # a tool never observed keeps its agent's conversation this long: past the fillers


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("vllm")
    model = export_smollm2(folder)
    # vLLM takes a named tool_choice only with a tool-call parser loaded (which it loads only with auto
    # tool choice on); pythonic needs no special tokens in the vocabulary
    flags = ["--device-tokens", str(POOL_TOKENS), "--api-key", "sekret", "--enable-auto-tool-choice",
             "--tool-call-parser", "pythonic"]
    with vllm_server(model, folder / "server.log", flags,
                     env={CONFIG_ENV: json.dumps({"tool_cold_hold_s": COLD_HOLD_S})}) as u:
        yield u


AUTH = {"Authorization": "Bearer sekret"}


WORDS = ("check", "the", "plan", "before", "you", "write", "code", "and", "test", "every", "change", "with", "care")


def _system(words: int) -> str:
    """About ``words`` tokens (common words are one token each), unique to this call."""
    tag = uuid.uuid4().hex[:8]
    return f"[{tag}] You are a meticulous agent. " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


def _chat(url: str, system: str, user: str, hint: KVFlowHint | None = None, max_tokens: int = 8) -> dict:
    body = {"model": _model(url),
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens, "temperature": 0}
    if hint is not None:
        body = attach_hint(body, hint)
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()
    return {"text": data["choices"][0]["message"]["content"], "prompt": data["usage"]["prompt_tokens"],
            "cached": (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0}


_MODELS: dict[str, str] = {}


def _model(url: str) -> str:
    if url not in _MODELS:
        _MODELS[url] = httpx.get(url + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"]
    return _MODELS[url]


def _stats(url: str) -> dict:
    r = httpx.get(url + "/kvflow/v1/stats", headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_info_names_the_backend_the_policy_and_where_hints_go(url: str) -> None:
    info = httpx.get(url + "/kvflow/v1/info", headers=AUTH, timeout=60).json()
    assert info["backend"] == "vllm" and info["policy"] == "kvflow" and info["protocol"] == 1
    assert info["capacities"]["block_size"] == BLOCK
    assert info["capacities"]["device_tokens"] == POOL_TOKENS
    # vLLM's own field first (it reaches Request.kv_transfer_params as sent); custom_params still read
    assert info["hints"]["openai"] == ["kv_transfer_params.kvflow", "custom_params.kvflow"]
    assert info["routes"]["steps"] == "/kvflow/v1/steps"


def test_routes_check_the_api_key(url: str) -> None:
    for path in ("/kvflow/v1/info", "/kvflow/v1/stats"):
        assert httpx.get(url + path, timeout=30).status_code == 401
    assert httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "w"}, timeout=30).status_code == 401


def test_bad_hints_and_steps_get_a_4xx_naming_the_field(url: str) -> None:
    body = {"model": _model(url), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and "steps" in r.json()["error"]["message"]
    body.pop("custom_params")
    body["kv_transfer_params"] = {"kvflow": {"agent": "a"}}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and "workflow_id" in r.json()["error"]["message"]
    r = httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "w", "steps": {"a": "soon"}}, headers=AUTH,
                   timeout=60)
    assert r.status_code == 422 and "steps" in r.json()["error"]["message"]
    r = httpx.post(url + "/kvflow/v1/steps", content=b"{", headers=AUTH, timeout=60)
    assert r.status_code == 400


def test_steps_updates_reach_the_scheduler(url: str) -> None:
    before = _stats(url)
    r = httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "wf-steps", "steps": {"a": 0, "b": None}},
                   headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["agents"] == 2
    mid = _stats(url)
    assert mid["workflows"] == before["workflows"] + 1 and mid["steps_updates"] == before["steps_updates"] + 1
    httpx.post(url + "/kvflow/v1/steps", json={"workflow_id": "wf-steps", "done": True}, headers=AUTH, timeout=60)
    assert _stats(url)["workflows"] == before["workflows"]


def test_a_hinted_agents_fixed_prompt_outlives_untagged_prefixes(url: str) -> None:
    """Pool: 15 blocks. The hinted agent's and an unhinted caller's system prompts (3+ blocks each)
    are cached, then four unrelated 4-block prompts pass through: stock LRU would evict the two
    oldest prefixes first; kvflow evicts untagged blocks first and keeps the agent's."""
    agent_system, plain_system = _system(420), _system(420)
    hint = KVFlowHint(workflow_id="wf-live", agent="planner", steps={"planner": 0, "coder": 1}, fixed_prefix=1)
    before = _stats(url)
    cold = _chat(url, agent_system, "Plan the release.", hint, max_tokens=12)
    _chat(url, plain_system, "Plan the release.")
    assert cold["prompt"] >= 3 * BLOCK
    mid = _stats(url)
    assert mid["hinted_requests"] == before["hinted_requests"] + 1
    assert mid["tagged_requests"] == before["tagged_requests"] + 1
    assert mid["tagged_blocks"] >= before["tagged_blocks"] + 3
    later = KVFlowHint(workflow_id="wf-live", agent="coder", steps={"planner": 1, "coder": 0})
    for i in range(4):  # the planner runs again after the coder: its prefix must survive this
        _chat(url, _system(540), f"filler {i}", later if i == 0 else None, max_tokens=2)
    after = _stats(url)
    assert after["evicted_device_tokens"] > mid["evicted_device_tokens"]
    again = _chat(url, agent_system, "Plan the release.", hint, max_tokens=12)
    plain = _chat(url, plain_system, "Plan the release.")
    assert again["cached"] >= 3 * BLOCK, (again, after)
    assert plain["cached"] == 0, plain
    assert again["text"] == cold["text"]  # greedy output is the same cold and from the cache


class LoopState(TypedDict, total=False):
    rounds: int


def test_an_instrumented_langgraph_app_drives_the_scheduler(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real LangGraph app (planner -> coder -> reviewer -> fix: coder | ship), made kvflow-aware by
    the README's two lines, against this server over HTTP: the client's /kvflow/v1/info probe finds
    a kvflow server, every call's hint reaches the scheduler and tags the agent's prompt, the
    steps protect the coder's prefix while the reviewer runs, and ``done`` ends the workflow."""
    pytest.importorskip("langchain_openai", reason="bash .ci/setup-vllm installs LangGraph into .venv-vllm")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    from kvflow_orch.langgraph import async_http_client, handler_of, http_client, instrument

    monkeypatch.setenv("KVFLOW_API_KEY", "sekret")  # the probe and steps updates (ChatOpenAI's key covers /v1)
    sent: list[dict] = []

    class Recorder(httpx.HTTPTransport):  # what the kvflow transport hands to the network
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/chat/completions"):
                sent.append(json.loads(request.read()))
            return super().handle_request(request)

    llm = ChatOpenAI(model=_model(url), base_url=url + "/v1", api_key="sekret", max_retries=0, max_tokens=4,
                     temperature=0, http_client=http_client(transport=Recorder()),
                     http_async_client=async_http_client())
    systems = {role: _system(300) for role in ("planner", "coder", "reviewer")}  # 2+ full blocks each
    before = _stats(url)
    seen: dict[str, dict] = {}

    def agent(role: str):
        def node(state: LoopState) -> dict:
            if role == "reviewer" and "reviewer" not in seen:  # the coder ran and will run again
                seen["reviewer"] = _stats(url)
            llm.invoke([SystemMessage(systems[role]), HumanMessage(f"Round {state.get('rounds', 0)}: go.")])
            return {"rounds": state.get("rounds", 0) + 1} if role == "reviewer" else {}
        return node

    graph = StateGraph(LoopState)
    for role in systems:
        graph.add_node(role, agent(role))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "coder")
    graph.add_edge("coder", "reviewer")
    graph.add_conditional_edges("reviewer", lambda s: "fix" if s["rounds"] < 2 else "ship",
                                {"fix": "coder", "ship": END})
    app = instrument(graph.compile(), namespace="lg-vllm", backend_url=url)
    try:
        app.invoke({"rounds": 0}, {"metadata": {"kvflow_workflow_id": "lg-wf"}, "recursion_limit": 12})
        handler_of(app).backend.flush()
    finally:
        handler_of(app).backend.close()
    after = _stats(url)
    calls = 5  # planner, coder, reviewer, coder, reviewer
    # the probe learned vLLM's preferred location from /kvflow/v1/info
    assert [body["kv_transfer_params"]["kvflow"]["agent"] for body in sent] == [
        "planner", "coder", "reviewer", "coder", "reviewer"]
    assert all("custom_params" not in body for body in sent)
    assert after["hinted_requests"] == before["hinted_requests"] + calls, after
    assert after["tagged_requests"] == before["tagged_requests"] + calls, after
    assert after["bad_hints"] == before["bad_hints"]
    assert after["steps_updates"] > before["steps_updates"]  # out-of-band updates reached the scheduler
    mid = seen["reviewer"]
    assert mid["workflows"] == before["workflows"] + 1, mid
    assert mid["protected_blocks"] >= before["protected_blocks"] + 2, mid  # the coder's 2 tagged blocks
    assert after["workflows"] == before["workflows"]  # done reached it too
    # the second coder and reviewer calls found their system prompts in vLLM's prefix cache
    assert after["device_hit_tokens"] - before["device_hit_tokens"] >= 2 * 2 * BLOCK, after
    _runtime_client_hints_in_kv_transfer_params(url)


def _runtime_client_hints_in_kv_transfer_params(url: str) -> None:
    """The runtime's HttpClient against the same server: its hint goes to kv_transfer_params.kvflow
    (learned from /kvflow/v1/info), and the scheduler still counts it hinted and tags the fixed prompt
    (the API server counted the prefix's tokens for a hint that arrived there)."""
    import asyncio

    from kvflow_orch.clients import HttpClient, HttpConfig
    from kvflow_orch.protocol import Sampling, StepsUpdate

    sent: list[dict] = []

    class Recording(HttpClient):
        async def _request(self, method: str, path: str, **kwargs):
            if path == "/v1/chat/completions":
                sent.append(kwargs["json"])
            return await super()._request(method, path, **kwargs)

    client = Recording(url, HttpConfig(api_key="sekret"))
    hint = KVFlowHint(workflow_id="rt-wf", namespace="rt", agent="writer", steps={"writer": 0}, fixed_prefix=1)
    messages = [{"role": "system", "content": _system(300)}, {"role": "user", "content": "Write."}]
    before = _stats(url)

    async def go() -> None:
        await client.chat(messages, Sampling(max_tokens=2, temperature=0), hint)
        client.send_steps(StepsUpdate(workflow_id="rt-wf", namespace="rt", done=True))
        await client.aclose()

    asyncio.run(go())
    assert client.hint_location == "kv_transfer_params.kvflow"
    (body,) = sent
    assert body["kv_transfer_params"]["kvflow"] == hint.model_dump(mode="json") and "custom_params" not in body
    after = _stats(url)
    assert after["hinted_requests"] == before["hinted_requests"] + 1, after
    assert after["tagged_requests"] == before["tagged_requests"] + 1, after
    assert after["tagged_blocks"] >= before["tagged_blocks"] + 2, after  # its 2+ full blocks of fixed prompt
    assert after["bad_hints"] == before["bad_hints"]


LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look a fact up in the project's notes.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


def _post(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json={"model": _model(url), "temperature": 0, **body},
                   headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _cached(reply: dict) -> int:
    return (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_a_plain_agents_conversation_outlives_other_traffic_across_its_tool_call(url: str) -> None:
    """A plain ReAct agent (no hint; ``prompt_cache_key`` is its session) asks for a named tool;
    while the tool runs, filler prompts larger than the pool pass through. Its conversation was kept
    (tagged until its deadline) so the return with the tool's result finds it cached, and the reply
    (text and first-token log-probabilities) is the one stock prefix caching gives: the same first
    call and return under another ``cache_salt``, with no traffic between them. A caller that made no
    tool call (``user`` as its session) is evicted like any dynamic suffix.

    Why that reference and not a cache-free request: on vLLM's CPU build a prefix's KV computed inside
    a shorter prompt differs in the last digits from the same prefix computed inside the full prompt,
    and SmolLM2's first tokens here are a near tie (``<|im_end|>``, "You", "The" within 0.25 nats),
    so a cached and a cache-free reply differ about one run in five with or without kvflow (measured:
    vLLM's own prefix cache, no eviction, moves the first token's log-probability by up to 0.2). What
    kvflow must not change is what the cache holds: the kept blocks give what vLLM's own give, exactly."""
    session = f"react-{uuid.uuid4().hex[:8]}"
    first = [{"role": "system", "content": _system(300)}, {"role": "user", "content": "When is the release?"}]
    control = [{"role": "system", "content": _system(300)}, {"role": "user", "content": "When is the release?"}]
    before = _stats(url)
    call = _post(url, {"messages": first, "tools": [LOOKUP], "max_tokens": 24, "prompt_cache_key": session,
                       "tool_choice": {"type": "function", "function": {"name": "lookup"}}})
    (tool_call,) = call["choices"][0]["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "lookup"
    _post(url, {"messages": control, "max_tokens": 8, "user": f"plain-{session}"})
    mid = _stats(url)
    assert mid["continuations_kept"] == before["continuations_kept"] + 1, mid
    assert call["usage"]["prompt_tokens"] >= 2 * BLOCK
    for i in range(4):  # 4 x 4+ blocks through a 15-block pool while the tool runs
        _chat(url, _system(540), f"filler {i}", max_tokens=2)
    after = _stats(url)
    assert after["evicted_device_tokens"] >= mid["evicted_device_tokens"] + 4 * BLOCK, after
    assert after["continuations_expired"] == before["continuations_expired"]  # the deadline outlasts the fillers
    tool_call = {**tool_call, "id": "call_lookup_0"}  # vLLM mints random ids; the reference sends this one too
    back = first + [{"role": "assistant", "content": "", "tool_calls": [tool_call]},
                    {"role": "tool", "tool_call_id": tool_call["id"], "content": "The release is on 15 January."}]
    logprobs = {"logprobs": True, "top_logprobs": 3}
    resumed = _post(url, {"messages": back, "max_tokens": 12, "prompt_cache_key": session, **logprobs})
    done = _stats(url)
    assert done["continuations_reused"] == before["continuations_reused"] + 1, done
    assert done["continuations"] == before["continuations"]  # returned: no longer kept
    assert _cached(resumed) >= 2 * BLOCK, (resumed["usage"], done)  # the conversation before the tool's result
    plain = _post(url, {"messages": control + [{"role": "user", "content": "Thanks."}], "max_tokens": 2,
                        "user": f"plain-{session}"})
    assert _cached(plain) == 0, plain["usage"]  # no tool call, no continuation: LRU evicted it
    salt = uuid.uuid4().hex  # the reference: stock prefix caching of the same two calls, nothing between
    _post(url, {"messages": first, "tools": [LOOKUP], "max_tokens": 24, "cache_salt": salt,
                "tool_choice": {"type": "function", "function": {"name": "lookup"}}})
    reference = _post(url, {"messages": back, "max_tokens": 12, "cache_salt": salt, **logprobs})
    assert _cached(reference) == _cached(resumed), (reference["usage"], resumed["usage"])
    assert resumed["choices"][0]["message"]["content"] == reference["choices"][0]["message"]["content"], (
        resumed["choices"], reference["choices"])
    assert resumed["choices"][0]["logprobs"] == reference["choices"][0]["logprobs"]


def test_a_responses_reply_with_a_function_call_pauses_its_session_as_a_chat_one(url: str) -> None:
    """``/v1/responses`` with a function tool (vLLM's own route): the reply's ``function_call`` item
    pauses the session (``prompt_cache_key``) as a chat reply's ``tool_calls`` does, and the agent's
    return with the call's output finds its conversation kept."""
    session = f"resp-{uuid.uuid4().hex[:8]}"
    tool = {"type": "function", "name": LOOKUP["function"]["name"], "description": LOOKUP["function"]["description"],
            "parameters": LOOKUP["function"]["parameters"]}
    first = [{"role": "system", "content": _system(300)}, {"role": "user", "content": "When is the release?"}]

    def respond(body: dict) -> dict:
        r = httpx.post(url + "/v1/responses", json={"model": _model(url), "temperature": 0, "max_output_tokens": 24,
                                                    "prompt_cache_key": session, **body}, headers=AUTH, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    before = _stats(url)
    reply = respond({"input": first, "tools": [tool], "tool_choice": {"type": "function", "name": "lookup"}})
    calls = [item for item in reply["output"] if item["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["lookup"], reply["output"]
    mid = _stats(url)
    assert mid["continuations_kept"] == before["continuations_kept"] + 1, mid
    back = first + [{"type": "function_call", "call_id": "call_lookup_0", "name": "lookup",
                     "arguments": calls[0]["arguments"]},
                    {"type": "function_call_output", "call_id": "call_lookup_0", "output": "On 15 January."}]
    respond({"input": back, "max_output_tokens": 8})
    done = _stats(url)
    assert done["continuations_reused"] == mid["continuations_reused"] + 1, done
