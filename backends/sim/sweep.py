"""Scenarios (workload x hardware x model) and running every system on each of them.

The standard sweep (:func:`standard_scenarios`) is what ``kvflow bench sim --standard`` runs and
what ``benchmarks/results/`` holds: the paper's single-workflow grid on H100/Qwen2.5-32B, its A10G
point, the concurrency grid, the MetaGPT and PEER graphs, and a host-link sensitivity line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from .profiles import HardwareProfile, ModelProfile, load_hardware, load_model
from .simulate import SimResult, simulate
from .systems import SYSTEM_NAMES, get_system
from .workloads import Workload, concurrent, from_workflow, synthetic

__all__ = ["Scenario", "ScenarioResult", "run_scenario", "run_scenarios", "standard_scenarios"]


@dataclass(frozen=True)
class Scenario:
    """``group`` names the plot/table the scenario belongs to; ``device_tokens`` caps the pool
    (``None``: what fits beside the weights)."""

    group: str
    hardware: HardwareProfile
    model: ModelProfile
    workload: Workload
    device_tokens: int | None = None
    host_tokens: int | None = None


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    results: dict[str, SimResult]
    wall_s: float

    def latency(self, system: str) -> float | None:
        r = self.results.get(system)
        return r.latency_s if r else None


def run_scenario(scenario: Scenario, systems: Sequence[str] = SYSTEM_NAMES) -> ScenarioResult:
    """Run ``systems`` on one scenario. ``belady`` is given the admission order of the ``kvflow``
    run (simulated first when not asked for) as its future."""
    for name in systems:
        get_system(name)
    order = [s for s in systems if s != "belady"]
    if "belady" in systems and "kvflow" not in order:
        order.append("kvflow")
    start = time.perf_counter()
    results: dict[str, SimResult] = {}
    for name in order + (["belady"] if "belady" in systems else []):
        future = results["kvflow"].admission_order if name == "belady" else None
        results[name] = simulate(get_system(name), scenario.workload, scenario.hardware, scenario.model,
                                 device_tokens=scenario.device_tokens, host_tokens=scenario.host_tokens,
                                 future=future)
    kept = {name: results[name] for name in systems}
    return ScenarioResult(scenario, kept, time.perf_counter() - start)


def run_scenarios(scenarios: Iterable[Scenario], systems: Sequence[str] = SYSTEM_NAMES,
                  progress: Callable[[ScenarioResult], None] | None = None) -> list[ScenarioResult]:
    out = []
    for scenario in scenarios:
        done = run_scenario(scenario, systems)
        if progress:
            progress(done)
        out.append(done)
    return out


def _link(hw: HardwareProfile, gbps: float) -> HardwareProfile:
    """``hw`` with an effective host link of ``gbps`` GB/s per direction."""
    return replace(hw, name=f"{hw.name}@{gbps:g}GB/s", link_efficiency=gbps * 1e9 / hw.link_bandwidth)


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
        hw = a10g if gbps is None else _link(a10g, gbps)
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
        for wf, name in ((metagpt(fix_rounds=2), "metagpt"), (peer(rounds=3), "peer")):
            out.append(Scenario("graphs", a10g, llama, from_workflow(
                wf, name=name, dynamic=256, output=128, loop_limit=3, instances=n, tenant_header=1024, seed=seed)))
    for gbps in (2, 4, 8, 16, 32, 64):
        out.append(Scenario("link", _link(h100, gbps), qwen, synthetic(fixed=4096, output=32, seed=seed)))
    return out
