"""Recording an engine's calls on the brain and replaying them: the same policy reproduces the
counters exactly, Bélády's offline order never recomputes more, a pool that holds everything
recomputes exactly the floor (dynamic parts and first uses), and traces the replay cannot follow
are refused. The same for a schedule of concurrent requests (``ScheduleRecorder``): Bélády on the
schedule a run executed."""

from __future__ import annotations

import random

import pytest

from backends.kvcache import CacheConfig, KVCache, Refused
from backends.kvcache.trace import BrainRecorder, ScheduleRecorder, TraceError, replay, replay_schedule
from kvflow_orch.protocol import KVFlowHint

AGENTS = {name: [1000 * (i + 1) + k for k in range(24)] for i, name in enumerate("abcdef")}
WEIGHTS = [8, 4, 2, 1, 1, 1]


def engine_like_request(cache: KVCache, prompt: list[int], agent: str, output: int = 3) -> None:
    """What the embedded engine does for one request (scheduler._try_admit / _give_back)."""
    adm = cache.admit(prompt)
    reused = min(len(adm.prefix_slots), len(prompt) - 1)
    alloc = cache.alloc_device(len(prompt) - reused + output - 1)
    assert alloc.slots is not None
    n = len(prompt) + output - 1
    outputs = [90_000 + k for k in range(output - 1)]
    cache.insert(prompt + outputs, list(adm.prefix_slots[:reused]) + list(alloc.slots[: n - reused]),
                 agent=("ns", agent), fixed_prefix_tokens=len(AGENTS[agent]))
    cache.free_device(alloc.slots[n - reused:])
    cache.unlock(adm.handle)


def recorded_run(config: CacheConfig, calls: int = 60, seed: int = 1):
    rng = random.Random(seed)
    cache = KVCache(config, clock=lambda: 0.0)
    rec = BrainRecorder(cache)
    names = list(AGENTS)
    floor, seen = 0, set()
    for i in range(calls):
        agent = rng.choices(names, WEIGHTS)[0]
        # expected steps as a learned tracker would send them: likelier agents nearer
        steps = {n: round(1 + 10 / w, 2) for n, w in zip(names, WEIGHTS, strict=True)}
        steps[agent] = 0
        cache.apply_hint(KVFlowHint(workflow_id=f"w{i // 10}", namespace="ns", agent=agent, steps=steps))
        dynamic = [50_000 + 8 * i + k for k in range(8)]
        engine_like_request(cache, AGENTS[agent] + dynamic, agent)
        floor += len(dynamic) + (0 if agent in seen else len(AGENTS[agent]))
        seen.add(agent)
    return cache, rec, floor


def test_replay_with_the_same_policy_reproduces_the_counters() -> None:
    config = CacheConfig(device_tokens=80, host_tokens=0, policy="kvflow", namespace_cap_tokens=80)
    cache, rec, _ = recorded_run(config)
    again = replay(rec.events, config)
    assert again.stats.as_dict() == cache.stats.as_dict()
    assert again.stats.recomputed_tokens > 0 and len(rec.requests) == 60
    again.check_integrity()


def test_belady_bounds_every_online_policy_and_a_huge_pool_gives_the_floor() -> None:
    config = CacheConfig(device_tokens=80, host_tokens=0, policy="kvflow", namespace_cap_tokens=80)
    cache, rec, floor = recorded_run(config)
    kvflow = cache.stats.recomputed_tokens
    lru = replay(rec.events, CacheConfig(device_tokens=80, policy="lru")).stats.recomputed_tokens
    best = replay(rec.events, config, belady=True).stats.recomputed_tokens
    everything = replay(rec.events, CacheConfig(device_tokens=10_000, namespace_cap_tokens=10_000))
    assert everything.stats.recomputed_tokens == floor
    assert floor <= best <= min(kvflow, lru) and best < lru


def test_traces_the_replay_cannot_follow_are_refused() -> None:
    config = CacheConfig(device_tokens=200)
    cache = KVCache(config, clock=lambda: 0.0)
    rec = BrainRecorder(cache)
    first = cache.admit(AGENTS["a"] + [1])
    cache.admit(AGENTS["b"] + [2])  # a second request before the first one ended
    cache.unlock(first.handle)
    with pytest.raises(TraceError, match="overlapping"):
        replay(rec.events, config)
    with pytest.raises(ValueError, match="host tier"):
        replay([], CacheConfig(device_tokens=200, host_tokens=100))
    incomplete = BrainRecorder(KVCache(config, clock=lambda: 0.0))
    incomplete.cache.admit(AGENTS["a"] + [1])
    with pytest.raises(TraceError, match="incomplete"):
        replay(incomplete.events, config)


# ---- schedules of concurrent requests -----------------------------------------------------
def concurrent_run(config: CacheConfig, calls: int = 80, seed: int = 2):
    """Up to three requests running at once, admitted and released in a random interleaving (the
    way the simulator and the engine drive reserve/release); refused attempts retried later."""
    rng = random.Random(seed)
    cache = KVCache(config, clock=lambda: 0.0)
    rec = ScheduleRecorder(cache)
    names, running, sent = list(AGENTS), [], 0
    while sent < calls or running:
        if sent < calls and len(running) < 3 and rng.random() < 0.6:
            agent = rng.choices(names, WEIGHTS)[0]
            prompt = AGENTS[agent] + [50_000 + 8 * sent + k for k in range(8)]
            outcome = cache.reserve(prompt, 3)
            if not isinstance(outcome, Refused):
                running.append((outcome, prompt + [90_000, 90_001]))
                sent += 1
        elif running:
            reservation, tokens = running.pop(rng.randrange(len(running)))
            cache.release(reservation, tokens)
    return cache, rec


def test_a_schedule_replayed_with_its_policy_reproduces_the_run_and_belady_never_recomputes_more() -> None:
    config = CacheConfig(device_tokens=96, policy="lru", prefetch=False)
    cache, rec = concurrent_run(config)
    assert any(e[0] == "admit" for e in rec.events) and len(rec.admissions) == 80
    assert replay_schedule(rec.events, config).stats.as_dict() == cache.stats.as_dict()
    best = replay_schedule(rec.events, config, belady=True)
    best.check_integrity()
    assert best.stats.recomputed_tokens < cache.stats.recomputed_tokens
    for policy in ("kvflow",):  # and on another policy's own schedule, never more than LRU there
        other = CacheConfig(device_tokens=96, policy=policy, prefetch=False)
        _, other_rec = concurrent_run(other, seed=5)
        lru = replay_schedule(other_rec.events, config).stats.recomputed_tokens
        assert replay_schedule(other_rec.events, other, belady=True).stats.recomputed_tokens <= lru


def test_belady_on_a_tiny_schedule_recomputes_exactly_what_a_hand_count_says() -> None:
    """A 10-token pool, four-token prompts A B C A B, one at a time (one new token each, nothing
    generated to keep). C needs room: LRU drops A (oldest), then A's return drops B, so all five
    compute 4 tokens: 20. Bélády drops B (used after A), A then hits whole (only its last token is
    computed, and that counts as a hit), B computes 4: 4 + 4 + 4 + 0 + 4 = 16."""
    config = CacheConfig(device_tokens=10, policy="lru", prefetch=False)
    cache = KVCache(config, clock=lambda: 0.0)
    rec = ScheduleRecorder(cache)
    prompts = {name: [base + k for k in range(4)] for name, base in (("A", 100), ("B", 200), ("C", 300))}
    for name in "ABCAB":
        reservation = cache.reserve(prompts[name], 1)
        cache.release(reservation, prompts[name])
    assert cache.stats.recomputed_tokens == 20
    assert replay_schedule(rec.events, config).stats.recomputed_tokens == 20
    assert replay_schedule(rec.events, config, belady=True).stats.recomputed_tokens == 16


def test_schedules_the_replay_cannot_follow_are_refused() -> None:
    config = CacheConfig(device_tokens=16, policy="lru", prefetch=False)
    with pytest.raises(TraceError, match="not running"):
        replay_schedule([("release", 0, (1, 2), None, 0)], config)
    with pytest.raises(TraceError, match="finds no room"):  # more locked at once than the pool holds
        replay_schedule([("admit", 0, tuple(range(12)), 1), ("admit", 1, tuple(range(100, 112)), 1)], config)
    with pytest.raises(ValueError, match="host tier"):
        replay_schedule([], CacheConfig(device_tokens=16, host_tokens=8))
    cache = KVCache(config, clock=lambda: 0.0)
    rec = ScheduleRecorder(cache)
    with pytest.raises(TraceError, match="did not see"):
        cache.release(KVCache(config, clock=lambda: 0.0).reserve([1, 2, 3], 1), [1, 2, 3])
    assert [e[0] for e in rec.events] == []
