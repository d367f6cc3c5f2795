"""End to end on the real embedded engine (tiny-random): over HTTP through the real embedded
server on 127.0.0.1, and in-process (backend=engine). The server's/engine's own observers record
what arrived; for every call the agent and the exact steps map the ASG semantics give at that
moment must arrive (conditional loop, parallel nodes with an AND-join, two concurrent workflows),
and every workflow must end with a done update."""

from __future__ import annotations

import asyncio

import pytest
from runtime_graphs import FAN_HINTS, LOOP_HINTS, by_workflow, fan_out_join, review_loop

from backends.local import Engine, EngineConfig
from backends.server import create_app, serve_in_thread
from kvflow_orch import WorkflowError
from kvflow_orch.runtime import arun, run, run_many

CONFIG = EngineConfig.build(model="tiny-random", device_tokens=4096, host_tokens=8192)


class Seen:
    def __init__(self) -> None:
        self.hints: list[dict] = []
        self.steps: list[dict] = []

    def request(self, route, request) -> None:
        self.hints.append(request.hint.model_dump(mode="json") if request.hint else None)

    def update(self, update) -> None:
        self.steps.append(update.model_dump(mode="json"))

    def done(self, workflow_id: str) -> bool:
        return any(u["workflow_id"] == workflow_id and u["done"] for u in self.steps)


@pytest.fixture(scope="module")
def embedded():
    seen = Seen()
    app = create_app(Engine(CONFIG), on_request=seen.request, on_steps=seen.update)
    with serve_in_thread(app) as running:
        yield running.url, seen


@pytest.fixture
def fresh(embedded):
    url, seen = embedded
    seen.hints.clear()
    seen.steps.clear()
    return url, seen


def test_loop_over_embedded_server(fresh):
    url, seen = fresh
    result = run(review_loop(), {"idea": "todo app"}, backend=url, workflow_id="e2e-loop")
    assert [(h["agent"], h["steps"]) for h in seen.hints] == LOOP_HINTS
    assert all(h["workflow_id"] == "e2e-loop" and h["fixed_prefix"] == 1 for h in seen.hints)
    assert seen.done("e2e-loop")
    assert isinstance(result.state["review"], str)
    # the second visit of eng/qa reuses their fixed prompts: the server reports cached tokens
    second_round = [c for c in result.calls if c.node in ("eng", "qa")][2:]
    assert all(c.cached_tokens > 0 for c in second_round)
    assert all(c.prompt_tokens > c.cached_tokens for c in result.calls)


def test_fan_out_and_join_over_embedded_server(fresh):
    url, seen = fresh
    run(fan_out_join(), {"topic": "caching"}, backend=url, workflow_id="e2e-fan")
    got = [(h["agent"], h["steps"]) for h in seen.hints]
    assert got[0] == ("plan", FAN_HINTS["plan"]) and got[-1] == ("merge", FAN_HINTS["merge"])
    assert sorted(got[1:3]) == [("w1", FAN_HINTS["w1"]), ("w2", FAN_HINTS["w2"])]
    assert seen.done("e2e-fan")


def test_two_concurrent_workflows_over_embedded_server(fresh):
    url, seen = fresh
    results = run_many(review_loop(), [{"idea": "one"}, {"idea": "two"}], backend=url)
    per_wf = by_workflow(seen.hints)
    assert set(per_wf) == {r.workflow_id for r in results}
    assert all(seq == LOOP_HINTS for seq in per_wf.values())
    assert all(seen.done(r.workflow_id) for r in results)


def without_kvflow_routes(app):
    """The real server as a plain OpenAI-compatible one: every /kvflow/ route answers 404."""

    async def plain(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/kvflow/"):
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"detail": "Not Found"}'})
            return
        await app(scope, receive, send)

    return plain


def test_fallback_on_the_real_server_without_kvflow_routes():
    seen = Seen()
    app = create_app(Engine(CONFIG), on_request=seen.request, on_steps=seen.update)
    with serve_in_thread(without_kvflow_routes(app)) as running:
        with pytest.warns(RuntimeWarning, match="not a kvflow server"):
            loop = run(review_loop(), {"idea": "x"}, backend=running.url)
        with pytest.warns(RuntimeWarning, match="not a kvflow server"):
            many = run_many(fan_out_join(), [{"topic": "a"}, {"topic": "b"}], backend=running.url)
    assert len(seen.hints) == 5 + 2 * 4 and all(h is None for h in seen.hints)
    assert seen.steps == []
    assert [r.node for r in loop.trace] == ["pm", "eng", "qa", "count", "eng", "qa", "count"]
    assert all(sorted(r.state["parts"]) == ["a", "b"] for r in many)


def test_api_key_from_environment(monkeypatch):
    app = create_app(Engine(CONFIG), api_key="s3cret")
    with serve_in_thread(app) as running:
        monkeypatch.delenv("KVFLOW_API_KEY", raising=False)
        with pytest.raises(WorkflowError, match=r"node 'pm': LLM call failed: .*HTTP 401.*KVFLOW_API_KEY"):
            run(review_loop(), {"idea": "x"}, backend=running.url)
        monkeypatch.setenv("KVFLOW_API_KEY", "s3cret")
        result = run(review_loop(rounds=1), {"idea": "x"}, backend=running.url)
    assert len(result.calls) == 3 and all(c.hint is not None for c in result.calls)


class RecordingEngine(Engine):
    """The real engine, noting the hints and steps updates it receives (nothing else changed)."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.seen = Seen()

    async def generate(self, request):
        self.seen.request("local", request)
        return await super().generate(request)

    def apply_steps(self, update) -> None:
        self.seen.update(update)
        super().apply_steps(update)


async def test_in_process_engine_gets_hints_and_done():
    engine = RecordingEngine(CONFIG)
    await engine.start()
    try:
        a, b = await asyncio.gather(
            arun(review_loop(), {"idea": "a"}, backend=engine, workflow_id="local-a"),
            arun(fan_out_join(), {"topic": "b"}, backend=engine, workflow_id="local-b"),
        )
        per_wf = by_workflow(engine.seen.hints)
        assert per_wf["local-a"] == LOOP_HINTS
        fan = per_wf["local-b"]
        assert fan[0] == ("plan", FAN_HINTS["plan"]) and fan[-1] == ("merge", FAN_HINTS["merge"])
        assert engine.seen.done("local-a") and engine.seen.done("local-b")
        # the plain collect_* nodes of the fan-out reported their starts/finishes out of band
        assert any(u["workflow_id"] == "local-b" and not u["done"] for u in engine.seen.steps)
        assert all(c.fixed_tokens and c.fixed_tokens < c.prompt_tokens for c in a.calls + b.calls)
        assert engine.stats()["requests_in_flight"] == 0
    finally:
        await engine.shutdown()


def test_engine_config_backend():
    config = EngineConfig.build(model="tiny-random", device_tokens=2048, host_tokens=0)
    result = run(review_loop(rounds=1), {"idea": "x"}, backend=config)
    assert len(result.calls) == 3 and all(c.prompt_tokens > 0 for c in result.calls)


def test_local_backend_string_runs_and_owns_its_engine():
    result = run(review_loop(rounds=1), {"idea": "x"}, backend="local:tiny-random")
    assert [r.node for r in result.trace] == ["pm", "eng", "qa", "count"]
    assert all(c.hint is not None for c in result.calls)


async def test_a_closed_client_whose_engine_cannot_start_again_fails_as_the_backend():
    from kvflow_orch.clients import LocalClient

    client = LocalClient(config=CONFIG)  # owns its engine: starts it on the first call
    await arun(review_loop(rounds=1), {"idea": "x"}, backend=client)
    await client.aclose()
    with pytest.raises(WorkflowError, match=r"node 'pm': LLM call failed: EngineError: .*shut down \(backend local:"):
        await arun(review_loop(rounds=1), {"idea": "x"}, backend=client)
