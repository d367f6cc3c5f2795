"""Scenarios (workload x hardware x model) and running every system on each of them.

The scenarios themselves are built by the caller, which compiles their workflows (the standard sweep
is :func:`kvflow_orch.harness.scenarios.standard_scenarios`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from backends.sim.profiles import HardwareProfile, ModelProfile
from backends.sim.simulate import SimResult, simulate
from backends.sim.systems import DEFAULT_SYSTEMS, get_system
from backends.sim.workloads import Workload

__all__ = ["Scenario", "ScenarioResult", "run_scenario", "run_scenarios", "with_link"]


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


def run_scenario(scenario: Scenario, systems: Sequence[str] = DEFAULT_SYSTEMS) -> ScenarioResult:
    """Run ``systems`` on one scenario. ``belady`` and ``oracle`` are given the admission order
    (and ``oracle`` the paths) of the ``kvflow`` run, simulated first when not asked for."""
    oracles = [s for s in systems if s in ("belady", "oracle")]
    for name in systems:
        get_system(name)
    order = [s for s in systems if s not in oracles]
    if oracles and "kvflow" not in order:
        order.append("kvflow")
    start = time.perf_counter()
    results: dict[str, SimResult] = {}
    for name in order + oracles:
        base = results["kvflow"] if name in oracles else None
        results[name] = simulate(get_system(name), scenario.workload, scenario.hardware, scenario.model,
                                 device_tokens=scenario.device_tokens, host_tokens=scenario.host_tokens,
                                 future=base.admission_order if base else None,
                                 paths=base.paths if base and name == "oracle" else None)
    kept = {name: results[name] for name in systems}
    return ScenarioResult(scenario, kept, time.perf_counter() - start)


def run_scenarios(scenarios: Iterable[Scenario], systems: Sequence[str] = DEFAULT_SYSTEMS,
                  progress: Callable[[ScenarioResult], None] | None = None) -> list[ScenarioResult]:
    out = []
    for scenario in scenarios:
        done = run_scenario(scenario, systems)
        if progress:
            progress(done)
        out.append(done)
    return out


def with_link(hw: HardwareProfile, gbps: float) -> HardwareProfile:
    """``hw`` with an effective host link of ``gbps`` GB/s per direction, named ``<hw>@<gbps>GB/s``
    (reports label such scenarios by their link speed)."""
    return replace(hw, name=f"{hw.name}@{gbps:g}GB/s", link_efficiency=gbps * 1e9 / hw.link_bandwidth)
