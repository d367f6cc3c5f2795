"""kvflow-learned in the simulator: skewed routing, trained routing statistics, fractional steps in
hints, and the supervisor/swarm workloads through `kvflow bench sim`."""

from __future__ import annotations

import io
import json
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace

import pytest

from backends.sim.orchestrator import train
from backends.sim.profiles import load_hardware, load_model
from backends.sim.simulate import simulate
from backends.sim.systems import get_system
from kvflow_orch import BranchStats
from kvflow_orch.cli import main as kvflow_main
from kvflow_orch.harness.scenarios import routed_device_tokens, routed_workload

H100, LLAMA = load_hardware("h100-sxm"), load_model("llama-3.1-8b")


def test_routing_follows_the_weights_and_training_learns_them():
    w = routed_workload("supervisor", fixed=256, rounds=20)
    spec = w.instances[0].spec
    stats = BranchStats()
    train(spec, stats, seed=3, runs=30)
    assert stats.decisions("supervisor", "supervisor") == 30 * 21
    probs = stats.probabilities("supervisor", "supervisor", spec.routing["supervisor"])
    weights = spec.routing["supervisor"]
    top = max(weights, key=weights.get)
    assert max(probs, key=probs.get) == top
    assert probs[top] == pytest.approx(weights[top] * 20 / 21, abs=0.06)  # END takes 1 decision in 21


def test_learned_hints_carry_fractional_steps_ordered_by_popularity():
    w = routed_workload("supervisor", fixed=512, rounds=10)
    hints = []
    simulate(get_system("kvflow-learned"), w, H100, LLAMA, device_tokens=routed_device_tokens(w), host_tokens=0,
             on_submit=lambda req: hints.append(req.hint))
    boss = [h for h in hints[9:] if h.agent == "supervisor"]
    assert boss, "no supervisor call after the warm-up"
    steps = boss[0].steps
    weights = w.instances[0].spec.routing["supervisor"]
    ranked = sorted(weights, key=weights.get, reverse=True)
    assert any(v != int(v) for v in steps.values())
    assert steps[ranked[0]] < steps[ranked[-1]]
    assert all(steps[a] >= 1 for a in ranked)
    static = []
    simulate(get_system("kvflow"), w, H100, LLAMA, device_tokens=routed_device_tokens(w), host_tokens=0,
             on_submit=lambda req: static.append(req.hint))
    assert {static[9 + hints[9:].index(boss[0])].steps[a] for a in ranked} == {1}


def test_learned_online_from_empty_statistics_within_one_run():
    # no training walks, fresh statistics: what the run learns reaches its own later hints
    w = replace(routed_workload("supervisor", fixed=256, rounds=60), train_runs=0)
    assert len(w.branch_stats) == 0
    hints = []
    simulate(get_system("kvflow-learned"), w, H100, LLAMA, device_tokens=routed_device_tokens(w), host_tokens=0,
             on_submit=lambda req: hints.append(req.hint))
    weights = w.instances[0].spec.routing["supervisor"]
    ranked = sorted(weights, key=weights.get, reverse=True)
    boss = [h.steps for h in hints[len(weights) + 1:] if h.agent == "supervisor"]
    assert {boss[0][a] for a in ranked} == {1}  # the first decisions are too few to rank: static steps
    last = boss[-1]
    assert last[ranked[-1]] > 2 * last[ranked[0]] > 2, last


def test_learned_keeps_the_popular_workers_without_a_host_tier():
    w = routed_workload("supervisor", fixed=1024, rounds=30)
    run = {name: simulate(get_system(name), w, H100, LLAMA, device_tokens=routed_device_tokens(w), host_tokens=0)
           for name in ("kvflow", "kvflow-learned")}
    assert run["kvflow-learned"].device_hit_ratio > run["kvflow"].device_hit_ratio
    assert run["kvflow-learned"].requests == run["kvflow"].requests  # the same route in both


def test_learned_without_statistics_is_a_clear_error():
    w = replace(routed_workload("swarm", fixed=128, rounds=3), branch_stats=None)
    with pytest.raises(ValueError, match="kvflow-learned needs routing statistics"):
        simulate(get_system("kvflow-learned"), w, H100, LLAMA, device_tokens=4096)


def test_training_leaves_the_workload_prior_untouched():
    w = routed_workload("swarm", fixed=128, rounds=4)
    simulate(get_system("kvflow-learned"), w, H100, LLAMA, device_tokens=8192)
    assert len(w.branch_stats) == 0


@pytest.mark.parametrize("workload", ["supervisor", "swarm"])
def test_bench_sim_routed_workloads(tmp_path, workload):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = kvflow_main(["bench", "sim", "--workload", workload, "--rounds", "6", "--agents", "4",
                          "--systems", "kvflow", "kvflow-learned", "belady", "infinite",
                          "--host-tokens", "0", "--no-plots", "--out", str(tmp_path)])
    assert rc == 0, err.getvalue()
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["system"] for r in rows} == {"kvflow", "kvflow-learned", "belady", "infinite"}
    assert "kvflow-learned device hits within 5% points of belady" in out.getvalue()
    assert Counter(r["labels"]["zipf_s"] for r in rows) == {1.2: 4}


def test_bench_sim_online_learns_from_empty_statistics(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = kvflow_main(["bench", "sim", "--workload", "swarm", "--online", "--rounds", "30", "--agents", "4",
                          "--systems", "kvflow", "kvflow-learned", "--host-tokens", "0", "--no-plots",
                          "--out", str(tmp_path)])
    assert rc == 0, err.getvalue()
    rows = {r["system"]: r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert set(rows) == {"kvflow", "kvflow-learned"}
    assert rows["kvflow"]["requests"] == rows["kvflow-learned"]["requests"]
    assert routed_workload("swarm", rounds=3, train_runs=0).train_runs == 0  # what --online builds
    assert routed_workload("swarm", rounds=3).train_runs > 0
    with redirect_stdout(io.StringIO()), redirect_stderr(err := io.StringIO()):
        rc = kvflow_main(["bench", "sim", "--workload", "synthetic", "--online", "--no-plots", "--out", str(tmp_path)])
    assert rc == 2 and "--online applies to --workload supervisor or swarm" in err.getvalue()


def test_oracle_hints_carry_the_true_distance_to_each_agents_next_call():
    from kvflow_orch.harness.sweep import Scenario, run_scenario

    w = routed_workload("swarm", fixed=512, rounds=12)
    device = routed_device_tokens(w)
    base = simulate(get_system("kvflow"), w, H100, LLAMA, device_tokens=device, host_tokens=None)
    path = base.paths[0]
    assert len(path) == 12 and base.requests == 12
    hints = []
    oracle = simulate(get_system("oracle"), w, H100, LLAMA, device_tokens=device, future=base.admission_order,
                      paths=base.paths, on_submit=lambda req: hints.append(req.hint))
    assert oracle.paths == base.paths  # routing draws from the instance's own stream: the same path
    measured = hints[len(w.instances[0].spec.fixed):]  # after one warm-up call per agent
    for i, hint in enumerate(measured):
        assert hint.agent == path[i] and hint.steps[path[i]] == 0
        for agent, steps in hint.steps.items():
            later = [j for j in range(i, len(path)) if path[j] == agent]
            assert steps == (later[0] - i if later else float("inf"))
    # without a host tier nothing can be prefetched: the oracle is Bélády's eviction exactly
    sr = run_scenario(Scenario("swarm", H100, LLAMA, w, device, 0), ["kvflow", "belady", "oracle"])
    assert sr.results["oracle"].stats == sr.results["belady"].stats


def test_oracle_needs_a_previous_runs_paths():
    w = routed_workload("swarm", fixed=128, rounds=3)
    with pytest.raises(ValueError, match="oracle system needs"):
        simulate(get_system("oracle"), w, H100, LLAMA, device_tokens=4096, future=())


def test_routed_summary_prints_the_bounds_side_by_side():
    from kvflow_orch.harness.sweep import Scenario, run_scenarios
    from backends.sim.systems import SYSTEM_NAMES
    from kvflow_orch.harness.targets import check_targets, learned_bounds

    w = routed_workload("swarm", fixed=512, rounds=12)
    device = routed_device_tokens(w)
    results = run_scenarios([Scenario("swarm-nohost", H100, LLAMA, w, device, 0)], SYSTEM_NAMES)
    lines = learned_bounds(results)
    r = results[0].results
    row = next(line for line in lines if line.startswith("swarm-nohost"))
    for name in ("kvflow-learned", "belady", "oracle", "infinite"):
        assert f"{r['kvflow'].latency_s / r[name].latency_s:.3f}x" in row
    markov = next(line for line in lines if line.startswith("Markov paging bound"))
    assert "pool of 2 agent prefixes" in markov and "best online policy" in markov
    speed = next(c for c in check_targets(results) if c.name.startswith("kvflow-learned >= 1.15x"))
    best = max(r["kvflow"].latency_s / r[n].latency_s for n in ("belady", "oracle"))
    assert f"bound {best:.3f}x" in speed.detail
