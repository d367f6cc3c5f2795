"""Event ordering of the simulated serving instance, determinism, and proof that every cache
decision comes from the shared brain (backends.kvcache), not from a copy inside the simulator."""

from __future__ import annotations

import math

import pytest

import backends.kvcache.policy as brain_policy
from backends.kvcache import CacheConfig, KVCache
from backends.sim.cost import CostModel
from backends.sim.serving import EngineLimits, ServingSim, SimRequest
from backends.sim.profiles import HardwareProfile, ModelProfile, load_hardware, load_model
from backends.sim.simulate import simulate
from backends.sim.systems import SYSTEMS, System
from kvflow_orch.harness.scenarios import synthetic
from kvflow_orch.protocol import KVFlowHint

# Toy device: a decode step is memory bound at 2e9 B / 5e10 B/s = 40 ms; a KV copy costs its 0.5 s
# latency (bytes are negligible), so a prefetch clearly spans several forward passes.
MODEL = ModelProfile("toy", params=1e9, n_layers=2, hidden_size=8, n_heads=2, n_kv_heads=1, head_dim=4)
HW = HardwareProfile("toy-gpu", peak_flops=1e12, mem_bandwidth=1e11, memory_bytes=4e9, link_bandwidth=1e9,
                     mem_fraction=1.0, link_efficiency=0.5, link_latency_s=0.5, compute_efficiency=0.5,
                     memory_efficiency=0.5, step_overhead_s=0.0)
COST = CostModel(HW, MODEL)
NS = "ns"


def _sim(system: System) -> ServingSim:
    config = CacheConfig(device_tokens=100, host_tokens=1000, policy=system.policy, write_through=True,
                         namespace_cap_tokens=100, prefetch=system.prefetch)
    return ServingSim(system, COST, config)


def _request(agent: str, prefix: tuple[int, ...], dynamic: tuple[int, ...], output: int, steps: dict,
             done: list) -> SimRequest:
    hint = KVFlowHint(workflow_id="wf", namespace=NS, agent=agent, steps=steps)
    return SimRequest(prefix + dynamic, tuple(range(7000, 7000 + output)), (NS, agent), len(prefix), hint,
                      done.append)


PB = tuple(range(1000, 1040))   # agent b's fixed prefix (40 tokens)
PX = tuple(range(2000, 2080))   # a big prompt that pushes b's prefix to host


def _b_on_host(sim: ServingSim, done: list) -> None:
    """Run b once, then a large unrelated request whose reservation demotes b's prefix to host."""
    sim.submit(_request("b", PB, (1, 2), 1, {"b": 0, "x": None, "a": None, "c": None}, done))
    sim.events.run()
    sim.submit(_request("x", PX, (3,), 2, {"x": 0, "b": None, "a": None, "c": None}, done))
    sim.events.run()
    m = sim.cache.match_prefix(PB)
    assert m.device_tokens == 0 and m.host_tokens == len(PB), "setup: b's prefix must be on host only"


def test_prefetch_overlaps_the_forward_pass_and_removes_the_admission_stall():
    sim = _sim(SYSTEMS["kvflow"])
    done: list[SimRequest] = []
    _b_on_host(sim, done)
    t0 = sim.events.now
    busy0 = sim.busy.compute_s
    # a runs 20 decode steps (~0.8 s); its hint says b is next, so b's prefix loads meanwhile (0.5 s).
    a = _request("a", tuple(range(3000, 3010)), (4,), 20, {"a": 0, "b": 1, "x": None, "c": None}, done)
    sim.submit(a)
    sim.events.run(until=t0)
    assert sim.h2d.busy_until == pytest.approx(t0 + 0.5, abs=1e-3)  # prefetch committed at once
    sim.events.run()
    assert a.finish_s > sim.h2d.busy_until  # the copy finished while a was still computing
    # a's time is pure compute: the transfer did not delay the compute stream
    assert a.finish_s - t0 == pytest.approx(sim.busy.compute_s - busy0, rel=1e-9)
    stats = sim.cache.stats
    before = stats.prefetch_hit_tokens
    b = _request("b", PB, (5,), 1, {"b": 0, "a": None, "x": None, "c": None}, done)
    sim.submit(b)
    sim.events.run()
    assert stats.prefetch_hit_tokens - before == len(PB)
    assert b.admitted_s == b.arrival_s  # no wait: its prefix was already on device


def test_hicache_loads_at_admission_and_the_pass_waits_for_the_copy():
    sim = _sim(SYSTEMS["hicache"])
    done: list[SimRequest] = []
    _b_on_host(sim, done)
    t0 = sim.events.now
    b = _request("b", PB, (5,), 1, {"b": 0}, done)
    sim.submit(b)
    sim.events.run()
    assert sim.cache.stats.host_hit_tokens == len(PB)
    # the pass ends no earlier than the load (0.5 s) plus one layer of compute
    assert b.finish_s - t0 >= 0.5


def _not_ready_scenario(system: System) -> tuple[SimRequest, SimRequest, float]:
    sim = _sim(system)
    done: list[SimRequest] = []
    _b_on_host(sim, done)
    a = _request("a", tuple(range(3000, 3010)), (4,), 20, {"a": 0, "b": 1, "x": None, "c": None}, done)
    sim.submit(a)
    sim.events.run(until=sim.events.now)
    load_end = sim.h2d.busy_until
    # b arrives while its prefix is loading (not ready); c arrives after it and is ready.
    b = _request("b", PB, (5,), 3, {"b": 0, "a": None, "x": None, "c": 1}, done)
    c = _request("c", tuple(range(4000, 4005)), (6,), 3, {"c": 0, "b": 0, "a": None, "x": None}, done)
    sim.events.schedule(sim.events.now + 0.05, sim.submit, b)
    sim.events.schedule(sim.events.now + 0.06, sim.submit, c)
    sim.events.run()
    assert not sim.waiting and not sim.running
    return b, c, load_end


def test_a_not_ready_request_does_not_block_a_ready_one():
    b, c, load_end = _not_ready_scenario(SYSTEMS["kvflow"])
    assert c.admitted_s < load_end <= b.admitted_s
    assert c.finish_s < b.finish_s


def test_without_status_awareness_the_loading_request_blocks_the_queue():
    fcfs = System("fcfs-prefetch", "kvflow", host_tier=True, prefetch=True, status_aware=False)
    b, c, load_end = _not_ready_scenario(fcfs)
    assert c.admitted_s >= load_end
    assert b.admitted_s <= c.admitted_s


def test_the_prefill_budget_counts_only_tokens_to_compute():
    """A long prompt whose prefix is cached joins a batch whose budget its full length would exceed."""
    system = SYSTEMS["gpu-only"]
    config = CacheConfig(device_tokens=100, policy=system.policy, namespace_cap_tokens=100, prefetch=False)
    sim = ServingSim(system, COST, config, limits=EngineLimits(max_prefill_tokens=50))
    done: list[SimRequest] = []
    sim.submit(_request("b", PB, (1,), 1, {"b": 0}, done))
    sim.events.run()
    fresh = _request("x", tuple(range(5000, 5030)), (), 2, {"x": 0}, done)  # 30 new tokens: 20 left
    cached = _request("b", PB, (2,), 2, {"b": 0}, done)  # 41 tokens, 40 of them cached: 1 to compute
    sim.submit(fresh)
    sim.submit(cached)
    sim.events.run()
    assert cached.cached_tokens == len(PB)
    assert cached.admitted_s == fresh.admitted_s and cached.first_token_s == fresh.first_token_s


H100, QWEN = load_hardware("h100-sxm"), load_model("qwen2.5-32b")


def _small(seed: int):
    return synthetic(fixed=2048, dynamic=16, output=8, n_agents=4, rounds=3, branches=2, seed=seed)


def test_same_seed_same_result_and_a_different_seed_differs():
    runs = [simulate(SYSTEMS["kvflow"], _small(7), H100, QWEN, device_tokens=6000) for _ in range(2)]
    assert runs[0].to_json() == runs[1].to_json()
    assert runs[0].admission_order == runs[1].admission_order
    other = simulate(SYSTEMS["kvflow"], _small(8), H100, QWEN, device_tokens=6000)
    assert other.admission_order != runs[0].admission_order


def test_the_simulator_drives_the_shared_brain(monkeypatch):
    sim = _sim(SYSTEMS["kvflow"])
    assert type(sim.cache) is KVCache
    calls = {"kvflow": 0}
    original = brain_policy.KVFlowPolicy.key

    def counting(self, node):
        calls["kvflow"] += 1
        return original(self, node)

    monkeypatch.setattr(brain_policy.KVFlowPolicy, "key", counting)
    result = simulate(SYSTEMS["kvflow"], _small(1), H100, QWEN, device_tokens=6000)
    assert calls["kvflow"] > 0 and result.stats["evicted_device_tokens"] > 0

    # Break the shared policy: the simulator must feel it (it has no copy of its own).
    def broken(self, node):
        raise RuntimeError("shared kvflow policy was consulted")

    monkeypatch.setattr(brain_policy.KVFlowPolicy, "key", broken)
    with pytest.raises(RuntimeError, match="shared kvflow policy was consulted"):
        simulate(SYSTEMS["kvflow"], _small(1), H100, QWEN, device_tokens=6000)


def test_a_policy_registered_in_the_brain_runs_in_the_simulator():
    name = "sim-test-lifo"
    if name not in brain_policy.policy_names():
        brain_policy.register_policy(name, lambda hints, **_: _NewestFirst())
    lifo = System(name, name, host_tier=False, prefetch=False, status_aware=False)
    got = simulate(lifo, _small(2), H100, QWEN, device_tokens=6000)
    lru = simulate(SYSTEMS["gpu-only"], _small(2), H100, QWEN, device_tokens=6000)
    assert got.stats != lru.stats


class _NewestFirst(brain_policy.EvictionPolicy):
    """Evicts the most recently created node first (a static key, as the brain's queue requires):
    on a cyclic workflow it keeps old prefixes that LRU would have thrown away."""

    name = "sim-test-lifo"

    def key(self, node):
        return -node.id


def test_paper_ordering_on_h100_qwen_4096():
    """Smaller run of the standard sweep's headline point: kvflow > kvflow-evict >= hicache > gpu-only,
    kvflow close to infinite, belady no worse than kvflow by more than noise."""
    w = synthetic(fixed=4096, output=32, rounds=3)
    lat = {}
    order = None
    for name in ("infinite", "gpu-only", "hicache", "kvflow-evict", "kvflow", "belady"):
        r = simulate(SYSTEMS[name], w, H100, QWEN, future=order)
        if name == "kvflow":
            order = r.admission_order
        lat[name] = r.latency_s
    assert lat["gpu-only"] > lat["hicache"] >= lat["kvflow-evict"] > lat["kvflow"]
    assert lat["kvflow"] <= 1.10 * lat["infinite"]
    assert math.isfinite(lat["belady"]) and lat["belady"] <= 1.02 * lat["kvflow"]


def test_on_submit_sees_every_request_warm_up_included():
    seen: list[SimRequest] = []
    w = _small(3)
    r = simulate(SYSTEMS["kvflow"], w, H100, QWEN, device_tokens=6000, on_submit=seen.append)
    assert len(seen) == len(w.instances[0].spec.fixed) + r.requests
    assert all(x.finish_s >= x.arrival_s for x in seen)


def test_the_simulator_follows_the_engines_life_cycle_in_the_brain():
    """Reserve what the engine reserves, insert what the engine inserts (the last output token's KV
    is never computed), tag what the intake decided, give every other slot and lock back."""
    sim = _sim(SYSTEMS["kvflow"])
    done: list = []
    first = _request("b", PB, (1, 2), 4, {"b": 0}, done)
    sim.submit(first)
    assert first.intake[:2] == ((NS, "b"), len(PB))  # decided at arrival by the brain's intake
    sim.events.run()
    prompt = PB + (1, 2)
    assert sim.cache.match_prefix(prompt + first.output).cached_tokens == len(prompt) + 3
    assert sim.cache.fixed_prefix((NS, "b")) == PB
    assert sim.cache.device.used_count == len(prompt) + 3 and not sim.cache._held
    again = _request("b", PB, (1, 2), 4, {"b": 0}, done)
    sim.submit(again)
    sim.events.run()
    assert again.cached_tokens == len(prompt) - 1  # the last prompt token is always computed
    assert all(node.lock_ref == 0 for node in sim.cache.tree) and len(done) == 2
    assert sim.cache.intake.counters["hinted_requests"] == 2
    sim.cache.check_integrity()
