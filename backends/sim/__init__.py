"""Paper-scale discrete-event simulator of one serving instance, driven by the shared cache brain.

Time comes from a roofline model of a hardware profile (:mod:`.cost`); every cache decision
(matching, eviction, prefetch, readiness) comes from :mod:`backends.kvcache`, the same code the
embedded engine runs. Entry point: :func:`simulate` (one system on one workload). The simulator
builds no workflows and judges no results: graph workloads take compiled Agent Step Graphs from the
caller, and sweeps over every system, their reports and the paper's targets are the harness's
(:mod:`kvflow_orch.harness`, behind ``kvflow bench``).
"""

from __future__ import annotations

from .cost import CostModel, Work
from .serving import EngineLimits, ServingSim, SimRequest
from .events import EventQueue
from .profiles import HardwareProfile, ModelProfile, ProfileError, device_kv_tokens, load_hardware, load_model
from .replay import load_trace
from .simulate import SimResult, simulate
from .systems import SYSTEM_NAMES, SYSTEMS, System, get_system
from .workloads import Workload, from_graph, synthetic

__all__ = [
    "CostModel", "Work", "EventQueue", "EngineLimits", "ServingSim", "SimRequest",
    "HardwareProfile", "ModelProfile", "ProfileError", "device_kv_tokens", "load_hardware", "load_model",
    "System", "SYSTEMS", "SYSTEM_NAMES", "get_system",
    "Workload", "synthetic", "from_graph", "load_trace",
    "SimResult", "simulate",
]
