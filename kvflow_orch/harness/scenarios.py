"""The simulator's workloads built from the bundled workflows, and the standard sweep.

The simulator (:mod:`backends.sim`) builds no workflows: it takes compiled Agent Step Graphs. This
module compiles them (``workflows.synthetic``, ``workflows.metagpt``, ``workflows.peer``) for
``kvflow bench``, the calibration and the tests.

The standard sweep (:func:`standard_scenarios`) is what ``kvflow bench sim --standard`` runs and
what ``benchmarks/results/`` holds: the paper's single-workflow grid on H100/Qwen2.5-32B, its A10G
point, the concurrency grid, the MetaGPT and PEER graphs, and a host-link sensitivity line.
"""

from __future__ import annotations

from typing import Any

from backends.sim.profiles import load_hardware, load_model
from backends.sim.workloads import Workload, from_graph
from backends.sim.workloads import synthetic as synthetic_workload
from kvflow_orch.asg import AgentStepGraph
from workflows.synthetic import stage_agents
from workflows.synthetic import synthetic as synthetic_workflow

from .sweep import Scenario, with_link

__all__ = ["synthetic_graph", "synthetic", "concurrent", "graph_workload", "standard_scenarios",
           "routed_workload", "routed_scenarios", "with_stats", "ROUTED_WORKLOADS"]

GRAPH_WORKLOADS = ("metagpt", "peer")
ROUTED_WORKLOADS = ("supervisor", "swarm")
TRAIN_RUNS = 20  # routing-only walks per instance the learned system has seen before measuring


def with_stats(workload: Workload, train_runs: int = 0) -> Workload:
    """``workload`` with fresh routing statistics for ``kvflow-learned`` (trained on ``train_runs``
    routing-only walks per instance when the simulation starts)."""
    from dataclasses import replace

    from kvflow_orch.branch_stats import BranchStats

    return replace(workload, branch_stats=BranchStats(), train_runs=train_runs)


def routed_workload(name: str, *, agents: int | None = None, zipf_s: float = 1.2, rounds: int | None = None,
                    fixed: int = 4096, dynamic: int = 32, output: int = 32, instances: int = 1,
                    seed: int = 0, train_runs: int = TRAIN_RUNS) -> Workload:
    """``workflows.supervisor`` (``agents`` workers, default 8, ``rounds`` worker turns, default 40)
    or ``workflows.swarm`` (``agents`` agents, default 6, ``rounds`` hand-offs, default 40) with
    role prompts of about ``fixed`` tokens each, routed by their seeded Zipf(``zipf_s``) weights.
    ``kvflow-learned`` trains on ``train_runs`` routing-only walks per instance first (0: online,
    from empty statistics, learning within the measured run only)."""
    rounds = rounds or 40
    # role prompts are filler words; text_tokens gives about 1.5 tokens per word
    words = max(1, int(fixed / 1.5))
    if name == "supervisor":
        from workflows.supervisor import routing, supervisor

        agents = agents or 8
        graph = supervisor(workers=agents, zipf_s=zipf_s, rounds=rounds, fixed=words, seed=seed).compile()
        weights, loop_limit = routing(agents, zipf_s), rounds + 1
    elif name == "swarm":
        from workflows.swarm import routing, swarm

        agents = agents or 6
        graph = swarm(agents=agents, zipf_s=zipf_s, hops=rounds, fixed=words, seed=seed).compile()
        weights, loop_limit = routing(agents, zipf_s, seed), rounds
    else:
        raise ValueError(f"unknown routed workload {name!r}; choose from {', '.join(ROUTED_WORKLOADS)}")
    w = from_graph(graph, name=name, dynamic=dynamic, output=output, loop_limit=loop_limit,
                   instances=instances, seed=seed, routing=weights)
    from dataclasses import replace

    return with_stats(replace(w, labels={**w.labels, "zipf_s": zipf_s, "rounds": rounds}), train_runs)


def routed_device_tokens(workload: Workload, share: float = 1 / 3) -> int:
    """A device pool holding ``share`` of the routed agents' fixed prefixes, plus the always-hot
    supervisor's prefix and room for every instance's running request."""
    spec = workload.instances[0].spec
    sizes = {a: len(t) for a, t in spec.fixed.items()}
    hot = sizes.pop("supervisor", 0)
    room = len(workload.instances) * (spec.dynamic_tokens + spec.output_tokens + 64)
    return int(hot + share * sum(sizes.values()) + room)


def routed_scenarios(name: str, seed: int = 0, instances: tuple[int, ...] = (1, 16),
                     train_runs: int = TRAIN_RUNS) -> list[Scenario]:
    """The learned-routing table: Llama-3.1-8B and Qwen2.5-32B on H100 and on A10G at a 2 GB/s link,
    ``instances`` concurrent workflows, host tier on and off, device pool per
    :func:`routed_device_tokens`; ``train_runs`` as :func:`routed_workload`'s."""
    h100, a10g = load_hardware("h100-sxm"), with_link(load_hardware("a10g"), 2)
    out = []
    for model in (load_model("llama-3.1-8b"), load_model("qwen2.5-32b")):
        for hw in (h100, a10g):
            for n in instances:
                w = routed_workload(name, instances=n, seed=seed, train_runs=train_runs)
                device = routed_device_tokens(w)
                for host in (None, 0):
                    group = f"{name}-{'host' if host is None else 'nohost'}"
                    out.append(Scenario(group, hw, model, w, device, host))
    return out


def synthetic_graph(n_agents: int = 10, branches: int = 1) -> AgentStepGraph:
    """The paper's sequential workflow compiled: ``n_agents`` stages, each one of ``branches``
    candidate agents, looping from the last stage back to the first (or to END). Only its graph is
    simulated; token content comes from :func:`backends.sim.workloads.synthetic`."""
    return synthetic_workflow(n_agents=n_agents, fixed=0, dynamic=0, output=1, rounds=1, branches=branches).compile()


def synthetic(*, n_agents: int = 10, branches: int = 1, **options: Any) -> Workload:
    """The paper's single-workflow benchmark (``instances=1``) or its concurrent variant on
    :func:`synthetic_graph`; ``options`` (``fixed``, ``dynamic``, ``output``, ``rounds``,
    ``instances``, ``seed``) go to :func:`backends.sim.workloads.synthetic`."""
    graph = synthetic_graph(n_agents, branches)
    return with_stats(synthetic_workload(graph, stage_agents(n_agents, branches), **options))


def concurrent(*, instances: int, fixed: int = 1024, dynamic: int = 256, output: int = 256,
               n_agents: int = 10, rounds: int = 2, seed: int = 0) -> Workload:
    """The paper's high-concurrency benchmark: ``instances`` independent sequential workflows."""
    return synthetic(fixed=fixed, dynamic=dynamic, output=output, n_agents=n_agents, rounds=rounds,
                     instances=instances, seed=seed)


def graph_workload(name: str, graph: AgentStepGraph | None = None, **options: Any) -> Workload:
    """``workflows.<name>`` (one of :data:`GRAPH_WORKLOADS`) with its default arguments, or
    ``graph``, as a workload; ``options`` go to :func:`backends.sim.workloads.from_graph`."""
    if graph is None:
        if name not in GRAPH_WORKLOADS:
            raise ValueError(f"unknown graph workload {name!r}; choose from {', '.join(GRAPH_WORKLOADS)}")
        import importlib

        graph = getattr(importlib.import_module(f"workflows.{name}"), name)().compile()
    return with_stats(from_graph(graph, name=name, **options))


def standard_scenarios(seed: int = 0) -> list[Scenario]:
    h100, a10g = load_hardware("h100-sxm"), load_hardware("a10g")
    qwen, llama = load_model("qwen2.5-32b"), load_model("llama-3.1-8b")
    out: list[Scenario] = []
    for branches in (1, 2):
        for output in (32, 256):
            for fixed in (1024, 2048, 4096, 8192):
                w = synthetic(fixed=fixed, dynamic=32, output=output, branches=branches, seed=seed)
                out.append(Scenario(f"single-b{branches}", h100, qwen, w))
    for gbps in (None, 2):  # the profile's link, and the "2GB/s" the paper's v1 states for its A10G
        hw = a10g if gbps is None else with_link(a10g, gbps)
        for fixed in (4096, 8192):
            out.append(Scenario("single-a10g", hw, llama, synthetic(fixed=fixed, output=32, seed=seed)))
    for model, counts in ((llama, (4, 16, 64)), (qwen, (4, 16))):
        for fixed in (512, 1024):
            for n in counts:
                out.append(Scenario(f"concurrent-{model.name}", h100, model,
                                    concurrent(instances=n, fixed=fixed, seed=seed)))
    from workflows.metagpt import metagpt
    from workflows.peer import peer

    for n in (1, 8, 16):
        for graph, name in ((metagpt(fix_rounds=2).compile(), "metagpt"), (peer(rounds=3).compile(), "peer")):
            out.append(Scenario("graphs", a10g, llama, graph_workload(
                name, graph, dynamic=256, output=128, loop_limit=3, instances=n, tenant_header=1024, seed=seed)))
    for gbps in (2, 4, 8, 16, 32, 64):
        out.append(Scenario("link", with_link(h100, gbps), qwen, synthetic(fixed=4096, output=32, seed=seed)))
    return out
