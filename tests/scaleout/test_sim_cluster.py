"""The simulator's many-worker mode: routing by agent keeps more fixed prompts cached than
round-robin, a lost worker's calls are served by the survivors, done empties every table."""

from __future__ import annotations

from itertools import pairwise

import pytest

from backends.sim import load_hardware, load_model
from backends.sim.scaleout import simulate_cluster
from backends.sim.workloads import Instance, Workload, WorkflowSpec, random_tokens
from kvflow_orch import END, START, Workflow

import random


def _workload(companies: int = 8, workflows: int = 32, fixed: int = 600) -> Workload:
    wf = Workflow("chain")
    agents = ["a", "b", "c", "d"]
    for name in agents:
        wf.add_agent(name, f"role {name}", "{x}", output="x")
    for x, y in pairwise([START, *agents, END]):
        wf.add_edge(x, y)
    asg = wf.compile()
    rng = random.Random(0)
    specs = [WorkflowSpec(asg, {a: random_tokens(rng, fixed) for a in agents}, dynamic_tokens=32, output_tokens=16)
             for _ in range(companies)]
    return Workload("chain", tuple(Instance(specs[i % companies], f"wf{i}", f"co{i % companies}", seed=i,
                                            start_s=0.05 * i) for i in range(workflows)), warmup=False)


@pytest.fixture(scope="module")
def profiles():
    return load_hardware("h100-sxm"), load_model("llama-3.1-8b")


def test_agent_routing_keeps_fixed_prompts_resident_better_than_round_robin(profiles) -> None:
    workload = _workload()
    pool = workload.fixed_tokens_total // 4
    rr = simulate_cluster(workload, *profiles, workers=4, routing="round_robin", device_tokens=pool)
    agent = simulate_cluster(workload, *profiles, workers=4, routing="agent", device_tokens=pool)
    for result in (rr, agent):
        assert result.workflows_finished == result.workflows == 32 and result.calls == 32 * 4
        assert result.tables_left == 0
    assert agent.fixed_hit_ratio > 1.5 * rr.fixed_hit_ratio


def test_a_worker_lost_mid_run_loses_no_workflow(profiles) -> None:
    workload = _workload()
    pool = workload.fixed_tokens_total // 4
    result = simulate_cluster(workload, *profiles, workers=4, routing="workflow", device_tokens=pool,
                              fail=(1, 0.06))
    assert result.rerouted > 0  # it held calls when it died
    assert result.workflows_finished == 32 and result.tables_left == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0, "routing": "agent"}, "workers must be >= 1"),
    ({"workers": 2, "routing": "sticky"}, "routing must be one of"),
    ({"workers": 2, "routing": "agent", "fail": (2, 1.0)}, "fail names worker 2"),
])
def test_bad_arguments_are_named(profiles, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        simulate_cluster(_workload(workflows=2), *profiles, device_tokens=4096, **kwargs)
