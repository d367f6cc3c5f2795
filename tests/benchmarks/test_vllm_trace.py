"""The vLLM benchmark's replay bounds (benchmarks/_vllm_trace.py) come from calls recorded on the
client side. Checked against a real embedded server over HTTP (tiny-random, no host tier): the
recorded calls, turned into brain calls, replay to the engine's own counters under the engine's
policy, so the bounds are computed on the requests the engine served."""

from __future__ import annotations

from backends.kvcache import CacheConfig
from backends.local import Engine, EngineConfig
from backends.local.model.loader import read_source
from backends.server import create_app, serve_in_thread
from benchmarks._vllm_trace import RecordedCall, RecordingClient, bounds, brain_events
from kvflow_orch.protocol import StepsUpdate
from kvflow_orch.runtime import arun
from workflows.synthetic import synthetic

WORKFLOW = synthetic(n_agents=4, fixed=60, dynamic=8, output=8, rounds=3)


def _pool() -> int:
    """About two and a half of the four fixed prompts (in tiny-random's tokenizer): the running call
    and part of the others fit, so evictions decide the hits."""
    tokenizer, asg = read_source("tiny-random")[2], WORKFLOW.compile()
    one = len(tokenizer.encode(tokenizer.render_chat([{"role": "system", "content": asg.system_prompt("s00")}],
                                                     add_generation_prompt=False)))
    return 5 * one // 2


async def test_recorded_calls_replay_to_the_engine_counters_and_bounds_are_ordered():
    pool = _pool()
    engine = Engine(EngineConfig.build(model="tiny-random", device_tokens=pool, host_tokens=0, policy="kvflow",
                                       prefetch=False))
    try:
        with serve_in_thread(create_app(engine)) as running:
            client = RecordingClient(running.url)
            try:
                await arun(WORKFLOW, {}, backend=client)
            finally:
                await client.aclose()
        stats = dict(engine.stats())
    finally:
        engine.close()
    calls = [item for item in client.log if isinstance(item, RecordedCall)]
    assert len(calls) == 12 and any(isinstance(item, StepsUpdate) for item in client.log)
    assert all(c.hint is not None and c.reply is not None for c in calls)

    config = CacheConfig(device_tokens=pool)
    events = brain_events(client.log, read_source("tiny-random")[2], config)
    b = bounds(events, config)
    assert b["prompt"] == sum(c.reply.prompt_tokens for c in calls)
    assert b["prompt"] - b["kvflow"] == stats["recomputed_tokens"]  # the same requests the engine served
    assert b["lru"] <= b["best_online"] <= b["belady"] <= b["all_cached"] <= b["prompt"]
    assert b["kvflow"] <= b["belady"] and b["belady"] > b["lru"]


def test_a_prompt_that_does_not_match_the_server_count_is_refused():
    from kvflow_orch.clients.base import LLMReply

    call = RecordedCall([{"role": "user", "content": "hello"}], 4, None, LLMReply("hi", 999, 1, 0))
    try:
        brain_events([call], read_source("tiny-random")[2], CacheConfig(device_tokens=1024))
    except ValueError as exc:
        assert "999" in str(exc)
    else:
        raise AssertionError("a mismatched prompt was accepted")
