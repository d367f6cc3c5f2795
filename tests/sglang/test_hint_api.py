"""Hints into SGLang: custom_params parsing and validation, the registered scheduler messages, and
the /kvflow/v1/* routes on SGLang's own FastAPI app.

The route tests run SGLang's real app, its real TokenizerManager dispatch tables (built by its own
``init_request_dispatcher`` with the plugin's hook), its real msgpack IPC encoding and its real
Scheduler dispatch table. Only the process boundary is replaced by :class:`SchedulerLink` (a
scheduler process needs a GPU model to start), and model-weight helpers the dispatch table merely
references are absent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytestmark = pytest.mark.sglang

GOOD = {"kvflow": {"workflow_id": "wf-1", "namespace": "app", "agent": "coder", "steps": {"coder": 0, "qa": 2}}}


# ---- custom_params parsing ---------------------------------------------------------------------
def test_parse_custom_params_reads_the_hint(plugin):
    from backends.sglang_kvflow.hints_bridge import parse_custom_params

    hint, explicit = parse_custom_params({**GOOD, "kvflow_fixed_tokens": 12, "other_plugin": 1})
    assert (hint.agent, hint.namespace, hint.workflow_id, hint.steps) == ("coder", "app", "wf-1", {"coder": 0, "qa": 2})
    assert explicit == 12
    assert parse_custom_params(None) is None and parse_custom_params({"unrelated": True}) is None
    # a newer client's extra hint field is ignored (with a warning), not a failure
    assert parse_custom_params({"kvflow": {"workflow_id": "w", "agent": "a", "bogus": 1}})[0].agent == "a"


@pytest.mark.parametrize("custom_params, names", [
    ("not-an-object", "custom_params must be an object"),
    ({"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}, "steps"),
    ({"kvflow": {"workflow_id": "w", "steps": {}}}, "agent"),
    ({"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": "soon"}}}, "steps"),
    ({"kvflow": {"workflow_id": "w", "agent": "a", "steps": {f"x{i}": 1 for i in range(5000)}}}, "limit"),
    ({"kvflow": "coder"}, "kvflow"),
    ({**GOOD, "kvflow_fixed_tokens": -3}, "kvflow_fixed_tokens"),
    ({**GOOD, "kvflow_hint": {"agent": "x", "sent_at": 1e12}}, "kvflow_hint"),  # set by the server only
])
def test_parse_custom_params_rejects_bad_hints_clearly(plugin, custom_params, names):
    from backends.sglang_kvflow.hints_bridge import parse_custom_params
    from kvflow_orch.protocol import HintError

    with pytest.raises(HintError) as info:
        parse_custom_params(custom_params)
    assert names in str(info.value)
    assert isinstance(info.value, ValueError)  # SGLang answers ValueError with HTTP 400 + message


def _word_tokenizer():
    """A real (tiny) fast tokenizer built with the tokenizers library, with a chat template: no
    model hub here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "[UNK] you are a careful reviewer . review this patch please <|system|> <|user|> <|assistant|> <|end|>"
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words.split())}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return fast


def test_generate_request_hook_validates_and_computes_the_token_boundary(plugin):
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from backends.sglang_kvflow.hints_bridge import FIXED_TOKENS_KEY, validate_generate_request
    from kvflow_orch.protocol import HintError

    manager = object.__new__(TokenizerManager)
    manager.tokenizer = _word_tokenizer()
    # A bad hint never reaches SGLang's own generate_request: the BEFORE hook raises first.
    bad = GenerateReqInput(text="hi", sampling_params={"custom_params": {"kvflow": {"agent": "a"}}})
    with pytest.raises(HintError, match="workflow_id"):
        TokenizerManager.generate_request(manager, bad)

    system = "you are a careful reviewer ."
    text = system + " review this patch please"
    hint = {"kvflow": {**GOOD["kvflow"], "fixed_prefix": len(system)}}
    obj = GenerateReqInput(text=text, sampling_params={"max_new_tokens": 4, "custom_params": hint})
    validate_generate_request(manager, obj)
    flat = obj.sampling_params["custom_params"]
    assert flat[FIXED_TOKENS_KEY] == 6  # you are a careful reviewer .
    assert "kvflow" not in flat  # the nested form never reaches the scheduler
    assert flat["kvflow_hint"]["agent"] == "coder" and flat["kvflow_steps"] == {"coder": 0, "qa": 2}


def test_chat_hook_turns_fixed_messages_into_prompt_tokens(plugin):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from backends.sglang_kvflow.hints_bridge import FIXED_TOKENS_KEY, mark_chat_boundary

    tokenizer = _word_tokenizer()
    serving = object.__new__(OpenAIServingChat)
    serving.tokenizer_manager = object.__new__(TokenizerManager)
    serving.tokenizer_manager.tokenizer = tokenizer
    messages = [{"role": "system", "content": "you are a careful reviewer ."},
                {"role": "user", "content": "review this patch please"}]
    hint = {"kvflow": {**GOOD["kvflow"], "fixed_prefix": 1}}
    request = ChatCompletionRequest(model="m", messages=messages, custom_params=hint)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    adapted = GenerateReqInput(input_ids=ids, sampling_params={"custom_params": hint})
    mark_chat_boundary((adapted, request), serving, request)
    # <|system|> you are a careful reviewer . <|end|>  -> 8 tokens, the user turn stays dynamic
    assert adapted.sampling_params["custom_params"][FIXED_TOKENS_KEY] == 8
    assert mark_chat_boundary((adapted, request), serving, request) is None  # explicit now: unchanged
    assert adapted.sampling_params["custom_params"][FIXED_TOKENS_KEY] == 8


def test_the_hint_of_a_queued_request_updates_the_table(make_rig, state):
    from backends.sglang_kvflow.tags import on_request_queued

    rig = make_rig(size=32, policy="kvflow", hicache=False)
    req = rig.make_req([5, 6, 7, 8], GOOD)
    on_request_queued(None, req)
    assert state.hints.steps(("app", "qa")) == 2 and state.hints.steps(("app", "coder")) == 0
    assert state.counters["hinted_requests"] == 1
    on_request_queued(None, rig.make_req([5, 6], {"kvflow_hint": {"agent": 3}}))  # bypassed the HTTP check
    assert state.counters["hinted_requests"] == 1  # ignored in the scheduler, never fatal


# ---- scheduler messages and HTTP routes --------------------------------------------------------
class _Absent:
    """Model-weight helpers the scheduler's dispatch table references but these tests never call."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


class SchedulerLink:
    """Stand-in for the ZMQ sockets between tokenizer manager and scheduler processes: messages
    cross with SGLang's real msgpack encoding, delivered on the event loop like a socket would."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.manager: Any = None
        self.delivered: list[Any] = []

    def send(self, obj: Any) -> None:
        from sglang.srt.managers.io_struct import msgpack_encode

        asyncio.get_running_loop().call_soon(self._deliver, msgpack_encode(obj))

    async def async_send(self, obj: Any) -> None:
        self.send(obj)

    def _deliver(self, data: bytes) -> None:
        from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode

        obj = msgpack_decode(data)
        self.delivered.append(obj)
        reply = self.scheduler._request_dispatcher(obj)
        if reply is not None:
            self.manager._result_dispatcher(msgpack_decode(msgpack_encode(reply)))


@pytest.fixture
def server(make_rig, state):
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs

    from backends.sglang_kvflow.routes import install_routes
    from backends.sglang_kvflow.state import get_state

    rig = make_rig(size=48, policy="kvflow", hicache=True, policy_config={"prefetch_lookahead": 2})
    scheduler = object.__new__(Scheduler)
    scheduler.flush_wrapper = scheduler.weight_updater = _Absent()
    scheduler.tree_cache, scheduler.token_to_kv_pool_allocator = rig.cache, rig.allocator
    scheduler.max_total_num_tokens = 48
    scheduler.init_request_dispatcher()  # SGLang's table + the plugin's AFTER hook

    link = SchedulerLink(scheduler)
    manager = object.__new__(TokenizerManager)
    manager._dispatch_to_scheduler = link.send
    manager._async_dispatch_to_scheduler = link.async_send
    manager.server_args = ServerArgs(model_path="dummy", radix_eviction_policy="kvflow",
                                     radix_eviction_policy_config='{"prefetch_lookahead": 2}',
                                     hicache_write_policy="write_through", max_total_tokens=48)
    manager.server_args.enable_hierarchical_cache = True
    with get_parallel().override(num_dp_ranks=1):
        manager.init_request_dispatcher()  # SGLang's table + the plugin's stats communicator
    link.manager = manager

    previous = http_server.get_global_state()
    http_server.set_global_state(http_server._GlobalState(tokenizer_manager=manager, template_manager=None,
                                                          scheduler_info={}))
    install_routes(http_server.app)
    try:
        yield TestClient(http_server.app), link, get_state()  # the rig's strategy configured it
    finally:
        http_server.set_global_state(previous)


def test_steps_route_reaches_the_scheduler_handler(server):
    from backends.sglang_kvflow.hints_bridge import KVFlowStepsReq

    client, link, state = server
    r = client.post("/kvflow/v1/steps", json={"workflow_id": "wf-9", "namespace": "app",
                                              "steps": {"planner": 1, "writer": None}})
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True, "workflow_id": "wf-9", "agents": 2, "done": False}
    assert isinstance(link.delivered[-1], KVFlowStepsReq)
    assert state.hints.steps(("app", "planner")) == 1
    assert state.hints.steps(("app", "writer")) == float("inf")
    assert state.counters["steps_updates"] == 1

    r = client.post("/kvflow/v1/steps", json={"workflow_id": "wf-9", "namespace": "app", "done": True})
    assert r.status_code == 200 and state.hints.workflow_count == 0


@pytest.mark.parametrize("body, status, names", [
    ({"workflow_id": "w", "steps": {"a": -2}}, 422, "steps"),
    ({"steps": {"a": 1}}, 422, "workflow_id"),
    ({"workflow_id": "w", "steps": {"a": 1}, "extra": 1}, 422, "extra"),
    ([1, 2], 422, "object"),
])
def test_steps_route_rejects_bad_bodies(server, body, status, names):
    client, link, state = server
    r = client.post("/kvflow/v1/steps", json=body)
    assert r.status_code == status
    assert names in r.json()["error"]["message"]
    assert link.delivered == [] and state.hints.workflow_count == 0


def test_steps_route_rejects_malformed_json(server):
    client, link, _ = server
    r = client.post("/kvflow/v1/steps", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"] and link.delivered == []


def test_info_and_stats_routes_answer(server):
    client, link, state = server
    info = client.get("/kvflow/v1/info").json()
    assert info["backend"] == "sglang" and info["policy"] == "kvflow" and info["prefetch_lookahead"] == 2
    assert info["tiers"] == ["device", "host"] and info["prefetch"] is True
    assert info["capacities"]["max_total_tokens"] == 48
    assert info["hints"] == {"openai": ["custom_params.kvflow"]}  # what hints_bridge reads

    client.post("/kvflow/v1/steps", json={"workflow_id": "w", "steps": {"a": 1}})
    stats = client.get("/kvflow/v1/stats").json()
    assert stats["ranks"] == 1
    assert stats["counters"]["steps_updates"] == 1 and stats["workflows"] == 1
    assert stats["device"]["capacity_tokens"] == 48 and stats["device"]["free_tokens"] == 48
    assert stats["host"]["capacity_tokens"] > 0
    assert stats["config"]["prefetch_lookahead"] == 2


def test_namespace_cap_defaults_to_half_the_device_pool(server):
    """As backends/kvcache's CacheConfig: the scheduler's pool is 48 tokens, so 24 per namespace."""
    _, _, state = server
    assert state.hints.cap_tokens == 24
    for agent in ("a", "b"):
        state.hints.note_fixed_tokens(("app", agent), 16)
    state.hints.set_steps("app", "wf", {"a": 0, "b": 1})
    assert state.hints.steps(("app", "a")) == 0 and state.hints.steps(("app", "b")) == float("inf")


def test_routes_answer_503_before_the_tokenizer_manager_runs(plugin):
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server

    from backends.sglang_kvflow.routes import install_routes

    previous = http_server.get_global_state()
    http_server.set_global_state(None)
    install_routes(http_server.app)
    try:
        client = TestClient(http_server.app)
        for method, path in (("get", "/kvflow/v1/stats"), ("get", "/kvflow/v1/info"), ("post", "/kvflow/v1/steps")):
            r = getattr(client, method)(path, **({"json": {"workflow_id": "w"}} if method == "post" else {}))
            assert r.status_code == 503 and "not running" in r.json()["error"]["message"], (path, r.text)
    finally:
        http_server.set_global_state(previous)


# ---- tensor parallelism: every rank expires hints alike ----------------------------------------
def test_ranks_fed_the_same_messages_at_different_wall_times_evict_identically(plugin):
    """TP ranks receive the same broadcast messages, each at its own time: expiry follows the
    stamps the HTTP side put in the messages, never a rank's own clock."""
    import time
    from types import SimpleNamespace

    from backends.kvcache.policy import kvflow_key
    from backends.sglang_kvflow.hints_bridge import KVFlowStepsReq, flatten_for_scheduler, handle_steps
    from backends.sglang_kvflow.state import PluginConfig, reset_state
    from backends.sglang_kvflow.tags import on_request_queued
    from kvflow_orch.protocol import KVFlowHint

    t0 = 1_000_000.0

    def request(workflow_id, agent, steps, sent_at):
        hint = KVFlowHint(workflow_id=workflow_id, namespace="app", agent=agent, steps=steps)
        params = flatten_for_scheduler({}, hint, 4, sent_at)
        return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=params), origin_input_ids=[1, 2, 3, 4])

    def messages():  # fresh objects per rank, as each rank decodes its own copy
        return [request("old", "planner", {"planner": 0, "coder": 1}, t0),
                request("new", "coder", {"coder": 0, "qa": 2}, t0 + 400),
                KVFlowStepsReq(workflow_id="new", namespace="app", steps={"coder": 1, "qa": 0}, sent_at=t0 + 650)]

    def rank(pause_s):
        state = reset_state(PluginConfig.from_options({"hint_ttl_s": 600}))
        for msg in messages():
            time.sleep(pause_s)
            if isinstance(msg, KVFlowStepsReq):
                handle_steps(None, msg)
            else:
                on_request_queued(None, msg)
        # what each scheduler iteration runs: expiry, then prefetch candidates
        state.intake.due(state.config.cache.prefetch_lookahead)
        agents = [("app", a) for a in ("planner", "coder", "qa")]
        return ({ref: state.hints.steps(ref) for ref in agents}, state.hints.workflow_count,
                sorted(agents, key=lambda ref: kvflow_key({ref}, state.hints, 0.0)))

    fast, slow = rank(0.0), rank(0.05)
    reset_state()
    assert fast == slow
    steps, workflows, order = fast
    # "old" was last stamped 650 s before the latest message: expired on every rank alike
    assert workflows == 1 and steps[("app", "planner")] == float("inf")
    assert steps[("app", "coder")] == 1 and steps[("app", "qa")] == 0
    assert order == [("app", "planner"), ("app", "coder"), ("app", "qa")]
