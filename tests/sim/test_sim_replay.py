"""Replay of recorded traces: dependency inference from timing, recorded hints reaching the brain,
and a trace recorded by the real runtime (`kvflow run --record` on the embedded tiny-random engine)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from backends.kvcache import CacheConfig
from backends.sim.cost import CostModel
from backends.sim.serving import ServingSim
from backends.sim.profiles import load_hardware, load_model
from backends.sim.replay import TraceClient, load_trace
from backends.sim.simulate import simulate
from backends.sim.systems import SYSTEMS
from kvflow_orch.cli import main as kvflow_main
from kvflow_orch.protocol import CallRecord

H100, QWEN = load_hardware("h100-sxm"), load_model("qwen2.5-32b")


def _call(wf: str, agent: str, offset: float, duration: float, steps: dict | None, fixed: int | None = 1000):
    hint = None if steps is None else {"workflow_id": wf, "namespace": "default", "agent": agent, "steps": steps,
                                       "fixed_prefix": 1}
    return CallRecord(time=1000.0 + offset, offset_s=offset, duration_s=duration, workflow_id=wf,
                      namespace="default", node=agent, agent=agent, hint=hint, prompt_tokens=1100,
                      fixed_tokens=fixed, completion_tokens=20, cached_tokens=0)


@pytest.fixture
def trace(tmp_path):
    calls = [
        # wf "seq": a -> b (0.5 s of plain-node time in between) -> a
        _call("seq", "a", 0.0, 1.0, {"a": 0, "b": 1}),
        _call("seq", "b", 1.5, 1.0, {"b": 0, "a": 1}),
        _call("seq", "a", 2.6, 1.0, {"a": 0, "b": None}),
        # wf "fan": x and y in parallel, then z joins them; no hints, no fixed boundary reported
        _call("fan", "x", 0.2, 2.0, None, fixed=None),
        _call("fan", "y", 0.3, 1.0, None, fixed=None),
        _call("fan", "z", 2.3, 1.0, None, fixed=None),
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(c.to_json() + "\n" for c in calls))
    return path


def test_dependencies_and_gaps_are_inferred_from_timing(trace):
    w = load_trace(trace)
    by_id = {inst.workflow_id: inst for inst in w.instances}
    seq, fan = by_id["seq"], by_id["fan"]
    assert [c.deps for c in seq.calls] == [(), (0,), (0, 1)]
    assert seq.calls[1].delay_s == pytest.approx(0.5)
    assert [c.delay_s for c in fan.calls] == pytest.approx([0.0, 0.1, 0.1])
    assert [c.deps for c in fan.calls] == [(), (), (0, 1)]
    assert fan.start_s == pytest.approx(0.2) and seq.start_s == 0.0
    assert len(seq.fixed["a"]) == 1000 and fan.fixed["x"] == ()  # unknown boundary: all dynamic
    assert seq.calls[0].hint.steps == {"a": 0, "b": 1}


def test_replayed_calls_wait_for_their_predecessors(trace):
    w = load_trace(trace)
    fan = next(i for i in w.instances if i.workflow_id == "fan")
    sim = ServingSim(SYSTEMS["kvflow"], CostModel(H100, QWEN),
                     CacheConfig(device_tokens=40000, host_tokens=80000, write_through=True))
    client = TraceClient(fan, sim, lambda c: None)
    client.start()
    sim.events.run()
    x, y, z = (client.requests[i] for i in range(3))
    assert x.arrival_s < y.finish_s  # x and y overlapped
    assert y.arrival_s == pytest.approx(x.arrival_s + 0.1)  # recorded 0.1 s apart
    assert z.arrival_s == pytest.approx(max(x.finish_s, y.finish_s) + 0.1)  # recorded gap after x ended
    assert client.end_s == z.finish_s


def test_recorded_hints_drive_the_brain(trace):
    kv = simulate(SYSTEMS["kvflow"], load_trace(trace), H100, QWEN, device_tokens=2500)
    lru = simulate(SYSTEMS["hicache"], load_trace(trace), H100, QWEN, device_tokens=2500)
    assert kv.requests == lru.requests == 6
    # a's prefix is protected (steps 1) while b runs, and prefetched back otherwise
    assert kv.stats["host_hit_tokens"] < lru.stats["host_hit_tokens"]


def test_replay_of_a_trace_recorded_by_the_runtime(tmp_path):
    path = tmp_path / "peer.jsonl"
    with redirect_stdout(io.StringIO()):
        rc = kvflow_main(["run", "workflows.peer:workflow", "--input", '{"question": "Is ACME a buy?"}',
                          "--backend", "local:tiny-random", "--record", str(path)])
    assert rc == 0
    w = load_trace(path)
    calls = sum(len(i.calls) for i in w.instances)
    assert calls == len(path.read_text().splitlines()) >= 4
    assert all(c.hint is not None for i in w.instances for c in i.calls)
    out = tmp_path / "out"
    with redirect_stdout(io.StringIO()) as text:
        rc = kvflow_main(["bench", "replay", str(path), "--out", str(out), "--systems", "hicache", "kvflow",
                          "--no-plots"])
    assert rc == 0
    assert "replay" in text.getvalue() and (out / "results.json").is_file()
