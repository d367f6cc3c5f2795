"""The engine on tiny-random: greedy outputs are identical whether the prefix was computed from
scratch, hit on device, reloaded from host or prefetched; every request (finished, failed, cancelled)
gives back every slot it took; sampling is seeded; bad requests get clear errors."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from backends.base import EngineError, GenerateRequest, RequestTooLarge, SamplingParams
from backends.kvcache import CacheConfig, LRUPolicy, policy_names, register_policy
from backends.local import Engine, EngineConfig
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

ROLES = {
    "planner": "You are the planner. Break the task into small steps and list them in order. " * 3,
    "coder": "You are the coder. Write compact, tested Python for each step you are given. " * 3,
    "critic": "You are the critic. Point out every bug and every unclear name you can find. " * 3,
}


def chat(engine: Engine, agent: str, question: str, max_tokens: int = 12, **hint) -> GenerateRequest:
    enc = engine.tokenizer.encode_chat(
        [{"role": "system", "content": ROLES[agent]}, {"role": "user", "content": question}], fixed_messages=1
    )
    return GenerateRequest(
        enc.input_ids,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        hint=KVFlowHint(workflow_id="wf", agent=agent, **hint) if hint else None,
        fixed_prefix_tokens=enc.fixed_prefix_tokens,
    )


def make_engine(**overrides) -> Engine:
    options = {"model": "tiny-random", "device_tokens": 4096, "host_tokens": 8192, **overrides}
    return Engine(EngineConfig.build(**options))


def wait_idle(engine: Engine, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if not stats["requests_in_flight"] and not stats["loads_in_flight"]:
            return stats
        time.sleep(0.01)
    raise AssertionError(f"engine not idle: {engine.stats()}")


def assert_no_leak(engine: Engine) -> None:
    """Only the tree owns device slots, nothing is held or locked, and the brain's invariants hold."""
    stats = wait_idle(engine)
    cache = engine.scheduler.cache
    assert stats["device_held"] == 0
    assert cache.check_integrity()
    assert all(node.lock_ref == 0 for node in cache.tree if not node.is_root)
    owned = sum(len(node) for node in cache.tree if not node.is_root and node.device is not None)
    assert cache.device.used_count == owned


@pytest.fixture()
def engine():
    eng = make_engine()
    yield eng
    eng.close()


MODELS = ["tiny-random", pytest.param("smollm2-135m", marks=pytest.mark.slow)]


def tight_pool(engine: Engine, max_tokens: int = 12) -> int:
    """Room for two agents' requests but not three: running the third pushes more than the dynamic
    tails out, so the least wanted agent's fixed prefix goes to host (under lru and kvflow alike)."""
    longest = max(len(chat(engine, agent, "Review the plan.").input_ids) for agent in ROLES)
    return 2 * (longest + max_tokens) + 8


@pytest.mark.parametrize("model", MODELS)
async def test_scratch_device_hit_host_reload_and_prefetch_give_identical_greedy_tokens(model):
    scratch = make_engine(model=model)
    reference = await scratch.generate(chat(scratch, "planner", "Plan a birthday party."))
    assert reference.cached_tokens == 0 and len(reference.output_ids) == 12
    pool = tight_pool(scratch)
    scratch.close()

    eng = make_engine(model=model, device_tokens=pool, host_tokens=4096, policy="lru")
    try:
        first = await eng.generate(chat(eng, "planner", "Plan a birthday party."))
        hit = await eng.generate(chat(eng, "planner", "Plan a birthday party."))
        assert hit.cached_tokens == hit.prompt_tokens - 1
        assert first.output_ids == hit.output_ids == reference.output_ids
        assert_no_leak(eng)

        for agent in ("coder", "critic"):
            await eng.generate(chat(eng, agent, "Review the plan."))
        before = eng.stats()["host_hit_tokens"]
        reloaded = await eng.generate(chat(eng, "planner", "Plan a birthday party."))
        assert eng.stats()["host_hit_tokens"] > before
        assert reloaded.output_ids == reference.output_ids
        assert_no_leak(eng)
    finally:
        eng.close()


@pytest.mark.parametrize("model", MODELS)
async def test_prefetched_prefix_gives_identical_greedy_tokens(model):
    scratch = make_engine(model=model)
    reference = await scratch.generate(chat(scratch, "planner", "Plan a trip."))
    pool = tight_pool(scratch)
    scratch.close()
    eng = make_engine(model=model, device_tokens=pool, host_tokens=4096, policy="kvflow")
    try:
        await eng.generate(chat(eng, "planner", "Plan a trip.", steps={"planner": 0}))
        for agent in ("coder", "critic"):  # the planner is not expected again: its prefix goes to host
            await eng.generate(chat(eng, agent, "Review the plan.", steps={"planner": None, agent: 0}))
        cache = eng.scheduler.cache
        assert cache.match_prefix(chat(eng, "planner", "x").input_ids).host_tokens > 0
        eng.apply_steps(StepsUpdate(workflow_id="wf", steps={"planner": 1, "coder": None, "critic": None}))
        deadline = time.monotonic() + 10
        while eng.stats()["prefetched_tokens"] == 0:
            assert time.monotonic() < deadline, eng.stats()
            await asyncio.sleep(0.01)
        before = eng.stats()
        request = chat(eng, "planner", "Plan a trip.", steps={"planner": 0})
        again = await eng.generate(request)
        stats = eng.stats()
        delta = {k: stats[k] - before[k] for k in ("prefetch_hit_tokens", "device_hit_tokens", "host_hit_tokens")}
        # the fixed prefix is on device (prefetched, or shared with the other agents' prompts);
        # only the earlier request's dynamic tail is loaded at admission
        assert delta["prefetch_hit_tokens"] > 0
        assert delta["prefetch_hit_tokens"] + delta["device_hit_tokens"] >= request.fixed_prefix_tokens
        assert delta["host_hit_tokens"] <= len(request.input_ids) - request.fixed_prefix_tokens
        assert again.output_ids == reference.output_ids
        assert_no_leak(eng)
    finally:
        eng.close()


async def test_concurrent_requests_match_their_sequential_outputs(engine):
    requests = [chat(engine, agent, f"Task number {i}.") for i, agent in enumerate(ROLES)]
    sequential = [(await engine.generate(r)).output_ids for r in requests]
    fresh = make_engine()
    try:
        together = await asyncio.gather(*(fresh.generate(chat(fresh, a, f"Task number {i}."))
                                          for i, a in enumerate(ROLES)))
        assert [r.output_ids for r in together] == sequential
        assert_no_leak(fresh)
    finally:
        fresh.close()


async def test_chunked_prefill_gives_identical_tokens(engine):
    reference = await engine.generate(chat(engine, "coder", "Write a parser."))
    chunked = make_engine(chunk_tokens=16)
    try:
        assert (await chunked.generate(chat(chunked, "coder", "Write a parser."))).output_ids == reference.output_ids
    finally:
        chunked.close()


async def test_stream_yields_text_deltas_and_a_final_result(engine):
    events = [e async for e in engine.stream(chat(engine, "critic", "Check this."))]
    result = events[-1].result
    assert result is not None and all(e.result is None for e in events[:-1])
    assert "".join(e.text_delta for e in events) == result.text
    assert [e.token_id for e in events] == list(result.output_ids)


async def test_closing_a_stream_aborts_and_frees_slots(engine):
    stream = engine.stream(chat(engine, "planner", "Long answer please.", max_tokens=400))
    async for _ in stream:
        break
    await stream.aclose()
    assert_no_leak(engine)


async def test_cancelling_generate_frees_slots(engine):
    task = asyncio.create_task(engine.generate(chat(engine, "coder", "Long answer please.", max_tokens=400)))
    while engine.stats()["running"] == 0:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_no_leak(engine)
    assert (await engine.generate(chat(engine, "coder", "Short."))).finish_reason == "length"


async def test_ending_a_request_does_not_touch_another_with_the_same_id(engine):
    # /generate lets clients choose the request id (rid); ending one request (finished or cancelled)
    # must not touch another that reuses it: cancels went by id to the first match
    long = dataclasses.replace(chat(engine, "coder", "Long answer please.", max_tokens=120), request_id="rid-1")
    short = dataclasses.replace(chat(engine, "critic", "Short.", max_tokens=2), request_id="rid-1")
    running = asyncio.create_task(engine.generate(long))
    while engine.stats()["running"] == 0:
        await asyncio.sleep(0.005)
    assert (await engine.generate(short)).finish_reason == "length"
    # cancelling one request must not cancel another with the same id either
    doomed = asyncio.create_task(engine.generate(dataclasses.replace(long, sampling=SamplingParams(max_tokens=400))))
    while engine.stats()["running"] < 2:
        assert not running.done(), "the first request ended before the second one started"
        await asyncio.sleep(0.005)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    result = await running
    assert result.finish_reason == "length" and len(result.output_ids) == 120
    assert_no_leak(engine)


async def test_failed_forward_fails_only_that_request_and_frees_slots(engine, monkeypatch):
    # fault injection: the real runner raises once, as a device error would
    real = engine.scheduler.runner.prefill
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated device fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.scheduler.runner, "prefill", flaky)
    with pytest.raises(RuntimeError, match="simulated device fault"):
        await engine.generate(chat(engine, "critic", "Anything."))
    assert_no_leak(engine)
    assert engine.stats()["failed_requests"] == 1
    assert (await engine.generate(chat(engine, "critic", "Anything."))).finish_reason == "length"
    assert_no_leak(engine)


async def test_seeded_sampling_is_reproducible(engine):
    def sampled(seed):
        req = chat(engine, "planner", "Be creative.", max_tokens=16)
        return GenerateRequest(req.input_ids, SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=seed,
                                                             ignore_eos=True))

    a, b, c = [await engine.generate(sampled(s)) for s in (7, 7, 8)]
    assert a.output_ids == b.output_ids
    assert a.output_ids != c.output_ids


async def test_stop_string_truncates_text(engine):
    base = await engine.generate(chat(engine, "coder", "Say something.", max_tokens=30))
    stop = base.text[10:13]
    req = chat(engine, "coder", "Say something.", max_tokens=30)
    sampling = SamplingParams(max_tokens=30, stop=(stop,), ignore_eos=True)
    stopped = await engine.generate(GenerateRequest(req.input_ids, sampling))
    assert stopped.finish_reason == "stop"
    assert stopped.text == base.text[: base.text.find(stop)]
    assert_no_leak(engine)


async def test_bad_requests_get_clear_errors(engine):
    small = make_engine(device_tokens=64, host_tokens=0)
    try:
        with pytest.raises(RequestTooLarge, match="device pool 64 tokens"):
            await small.generate(chat(small, "planner", "Too long for this pool."))
    finally:
        small.close()
    with pytest.raises(EngineError, match="prompt is empty"):
        await engine.generate(GenerateRequest(()))
    with pytest.raises(EngineError, match="outside the vocabulary"):
        await engine.generate(GenerateRequest((1, 2, 99999)))
    with pytest.raises(EngineError, match="fixed_prefix_tokens is 9"):
        await engine.generate(GenerateRequest((1, 2, 3), fixed_prefix_tokens=9))
    with pytest.raises(TypeError, match="StepsUpdate"):
        engine.apply_steps({"workflow_id": "x"})  # type: ignore[arg-type]
    assert_no_leak(engine)


def test_info_and_stats_report_tiers_and_counters(engine):
    info = engine.info()
    assert info["policy"] == "kvflow" and info["tiers"]["device"]["tokens"] == 4096
    assert info["tiers"]["host"]["tokens"] == 8192 and info["model"] == "tiny-random"
    stats = engine.stats()
    for key in ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens", "recomputed_tokens",
                "device_used", "device_total", "host_used", "host_total"):
        assert key in stats
    with pytest.raises(ValueError, match="policy must be one of"):
        EngineConfig.build(policy="fifo")
    with pytest.raises(ValueError, match="policy must be one of"):  # an oracle needs the future
        EngineConfig.build(policy="belady")


def test_engine_config_names_a_bad_cache_value_and_an_unknown_option():
    with pytest.raises(ValueError, match="device_tokens must be an integer, got '4096'"):
        EngineConfig.build(device_tokens="4096")
    with pytest.raises(TypeError, match="max_bach"):
        EngineConfig.build(max_bach=4)
    assert EngineConfig.build(host_tokens=0, prefetch=False).cache == CacheConfig(device_tokens=8192, prefetch=False)


def test_a_policy_registered_in_the_brain_is_accepted_by_the_engine_config():
    name = "engine-test-newest-first"
    if name not in policy_names():
        register_policy(name, lambda hints, **_: LRUPolicy())
    config = EngineConfig.build(policy=name, device_tokens=256, host_tokens=0)
    assert config.cache.policy == name and config.cache == CacheConfig(device_tokens=256, policy=name)
    assert EngineConfig(cache=config.cache) == config


async def test_inspect_cache_runs_on_the_loop_thread(engine):
    import threading

    await engine.generate(chat(engine, "planner", "Anything."))
    seen = await engine.inspect_cache(lambda cache: (threading.current_thread().name, cache.check_integrity()))
    assert seen == ("kvflow-engine", True)
    with pytest.raises(ZeroDivisionError):
        await engine.inspect_cache(lambda cache: 1 / 0)
    assert (await engine.generate(chat(engine, "planner", "Again."))).finish_reason == "length"


async def test_unexpected_loop_error_fails_requests_cleanly_and_keeps_serving(engine, monkeypatch):
    # fault injection: a bug inside a step (outside any single request's forward)
    scheduler = engine.scheduler
    real = scheduler._decode

    def broken() -> bool:
        if not scheduler.running:
            return real()
        monkeypatch.setattr(scheduler, "_decode", real)
        raise KeyError("simulated bug")

    monkeypatch.setattr(scheduler, "_decode", broken)
    with pytest.raises(EngineError, match="internal engine error: KeyError"):
        await engine.generate(chat(engine, "planner", "Anything."))
    assert_no_leak(engine)
    assert (await engine.generate(chat(engine, "planner", "Anything."))).finish_reason == "length"


def test_model_loads_on_a_passing_thread_and_load_errors_reach_the_caller(monkeypatch):
    # Loading on the caller's thread would leave it an OpenMP team next to the loop thread's, which
    # on a small machine throttles libgomp's spin-waiting and slows every forward (see engine.py).
    import threading

    import backends.local.engine as engine_module

    loaders: list[threading.Thread] = []
    real_load = engine_module.load_model

    def recording_load(*args, **kwargs):
        loaders.append(threading.current_thread())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", recording_load)
    engine = make_engine()
    try:
        assert loaders and loaders[0] is not threading.current_thread() and not loaders[0].is_alive()
        assert asyncio.run(engine.generate(chat(engine, "planner", "hi", max_tokens=2))).output_ids
    finally:
        engine.close()
    with pytest.raises(ValueError, match="unknown model 'gpt-17'"):
        make_engine(model="gpt-17")
