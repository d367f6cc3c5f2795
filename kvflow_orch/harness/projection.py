"""Recorded calls replayed by the simulator on the paper's GPU profiles: what the same calls would
take on an H100 serving Qwen2.5-32B or an A10G serving Llama-3.1-8B (simulated, not measured).

The replay keeps each call's prompt, fixed-prefix and reply lengths, its hint and its dependencies
(:mod:`backends.sim.replay`), and starts from a cold cache as a recorded run did. Each profile runs
four systems on the same device pool: the recorded configuration (no host tier: LRU, then kvflow's
eviction alone) and the paper's (a host tier: HiCache's LRU with loads at admission, then kvflow with
its prefetch and status-aware scheduling).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from backends.sim.profiles import load_hardware, load_model
from backends.sim.replay import load_trace
from backends.sim.simulate import simulate
from backends.sim.systems import System, get_system

from .sweep import with_link

__all__ = ["GPU_PROFILES", "PROJECTED_SYSTEMS", "Projection", "project_trace"]

GPU_PROFILES = (
    ("H100 + Qwen2.5-32B", "h100-sxm", "qwen2.5-32b", None),
    ("A10G (2 GB/s link) + Llama-3.1-8B", "a10g", "llama-3.1-8b", 2.0),
)
"""The paper's two single-workflow setups: label, hardware, model, host-link GB/s (``None``: the profile's)."""

PROJECTED_SYSTEMS = (
    ("lru", get_system("gpu-only")),
    ("kvflow", System("kvflow-device", "kvflow", host_tier=False, prefetch=False, status_aware=False)),
    ("hicache", get_system("hicache")),
    ("kvflow+host", get_system("kvflow")),
)
"""Column name and simulated system: the recorded configuration first (no host tier), then the
paper's (a host tier holding every fixed prefix)."""


class Projection(NamedTuple):
    label: str
    seconds: dict[str, float]
    """Column name -> simulated workflow time (s)."""

    def speedup(self, baseline: str, system: str) -> float:
        return self.seconds[baseline] / self.seconds[system] if self.seconds[system] else float("inf")


def project_trace(trace: Path, device_tokens: int) -> list[Projection]:
    """Simulate the calls recorded in ``trace`` (a ``kvflow run --record`` file) on every profile of
    :data:`GPU_PROFILES` with a ``device_tokens`` pool."""
    workload = replace(load_trace(trace), warmup=False)
    out = []
    for label, hardware, model, gbps in GPU_PROFILES:
        hw = load_hardware(hardware)
        hw = with_link(hw, gbps) if gbps is not None else hw
        profile = load_model(model)
        seconds = {name: simulate(system, workload, hw, profile, device_tokens=device_tokens).latency_s
                   for name, system in PROJECTED_SYSTEMS}
        out.append(Projection(label, seconds))
    return out
