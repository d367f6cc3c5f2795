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


async def test_concurrent_calls_become_block_replay_requests_that_overlap_as_they_ran():
    import asyncio

    from backends.kvcache.block_replay import block_bounds
    from benchmarks._vllm_trace import block_requests

    apps = ("a", "b")
    flows = [synthetic(n_agents=2, fixed=60, dynamic=8, output=4, rounds=2, app=app) for app in apps]
    engine = Engine(EngineConfig.build(model="tiny-random", device_tokens=4096, host_tokens=0, policy="kvflow",
                                       prefetch=False))
    try:
        with serve_in_thread(create_app(engine)) as running:
            client = RecordingClient(running.url)
            try:
                await asyncio.gather(*(arun(flow, {}, backend=client, namespace=app)
                                       for flow, app in zip(flows, apps, strict=True)))
            finally:
                await client.aclose()
    finally:
        engine.close()
    calls = [item for item in client.log if isinstance(item, RecordedCall)]
    requests = block_requests(client.log, read_source("tiny-random")[2])
    assert [len(r.prompt) for r in requests] == [c.reply.prompt_tokens for c in calls]
    assert [r.output for r in requests] == [c.reply.completion_tokens for c in calls]
    assert all(r.fixed is not None and 0 < r.fixed < len(r.prompt) for r in requests)
    # both workflows' first calls were sent before either was answered
    assert requests[1].start < requests[0].end
    stamps = sorted([r.start for r in requests] + [r.end for r in requests])
    assert stamps == list(range(1, 2 * len(requests) + 1))
    # every agent's second call repeats its fixed prompt: a pool that holds it all hits it (and any
    # block past it that repeats too, which the best online bound, on hinted blocks only, leaves out)
    got = block_bounds(requests, 4096 // 16, 16)
    seen: set[tuple[int, ...]] = set()
    fixed_blocks = 0
    for r in requests:
        head = tuple(r.prompt[:r.fixed])
        fixed_blocks += r.fixed // 16 * 16 if head in seen else 0
        seen.add(head)
    assert got["lru"] == got["belady"] >= got["best_online"] == fixed_blocks > 0
