"""Run one system on one workload and measure it: the simulator's single entry point.

The warm-up phase (each agent of each instance once) is excluded: measurement starts when every
instance has warmed up, from a snapshot of the brain's counters, and ends when the last instance
finishes. ``latency_s`` is the mean end-to-end time of the workflow instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from backends.kvcache import CacheConfig
from backends.kvcache.policy import BeladyPolicy

from .cost import CostModel
from .serving import EngineLimits, ServingSim, SimRequest
from .orchestrator import GraphClient, OracleClient, train
from .profiles import HardwareProfile, ModelProfile, device_kv_tokens
from .replay import TraceClient, TraceInstance
from .systems import System
from .workloads import Instance, Workload

__all__ = ["SimResult", "Capacity", "simulate", "capacity_for"]


@dataclass(frozen=True)
class Capacity:
    device_tokens: int
    host_tokens: int


@dataclass(frozen=True)
class SimResult:
    system: str
    workload: str
    labels: Mapping[str, Any]
    latency_s: float
    makespan_s: float
    requests: int
    prompt_tokens: int
    stats: Mapping[str, int]
    device_tokens: int
    host_tokens: int
    compute_busy_s: float
    h2d_busy_s: float
    d2h_busy_s: float
    admission_order: tuple[tuple[int, ...], ...] = ()
    paths: tuple[tuple[str, ...], ...] = ()
    """Per graph instance, in workload order: the agents of its measured calls (what ``oracle`` reads)."""

    @property
    def device_hit_ratio(self) -> float:
        """Share of prompt tokens found on device at admission (hits plus prefetch hits)."""
        hit = self.stats.get("device_hit_tokens", 0) + self.stats.get("prefetch_hit_tokens", 0)
        return hit / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system, "workload": self.workload, "labels": dict(self.labels),
            "latency_s": self.latency_s, "makespan_s": self.makespan_s, "requests": self.requests,
            "prompt_tokens": self.prompt_tokens, "device_hit_ratio": self.device_hit_ratio,
            "stats": dict(self.stats), "device_tokens": self.device_tokens, "host_tokens": self.host_tokens,
            "compute_busy_s": self.compute_busy_s, "h2d_busy_s": self.h2d_busy_s, "d2h_busy_s": self.d2h_busy_s,
        }


def capacity_for(system: System, workload: Workload, hardware: HardwareProfile, model: ModelProfile,
                 device_tokens: int | None = None, host_tokens: int | None = None) -> Capacity:
    """Pool sizes: the device pool beside the weights (or ``device_tokens``); a host pool of every
    fixed prefix twice over plus the device pool (or ``host_tokens``). ``infinite`` gets the same pool
    plus room for every fixed prefix, which its policy (kvflow: dynamic suffixes go first, and they
    are never reused) then never has to evict: no prefix is recomputed or loaded, while running
    requests get no more room than in the other systems."""
    device = device_tokens if device_tokens is not None else device_kv_tokens(hardware, model)
    fixed_total = workload.fixed_tokens_total
    if system.infinite:
        return Capacity(device + fixed_total, 0)
    host = 0
    if system.host_tier:
        host = host_tokens if host_tokens is not None else 2 * fixed_total + device
    return Capacity(device, host)


def simulate(
    system: System,
    workload: Workload,
    hardware: HardwareProfile,
    model: ModelProfile,
    *,
    device_tokens: int | None = None,
    host_tokens: int | None = None,
    limits: EngineLimits = EngineLimits(),
    future: Sequence[Sequence[int]] | None = None,
    on_submit: Callable[[SimRequest], None] | None = None,
    paths: Sequence[Sequence[str]] | None = None,
) -> SimResult:
    """Simulate ``workload`` on ``system``. ``belady`` and ``oracle`` need ``future``: the admission
    order of the same workload (``SimResult.admission_order`` of a previous run, e.g. of ``kvflow``);
    ``oracle`` also needs that run's ``paths`` (graph workloads only).
    ``on_submit`` sees every request (warm-up included) as it reaches the simulated server."""
    cap = capacity_for(system, workload, hardware, model, device_tokens, host_tokens)
    config = CacheConfig(
        device_tokens=cap.device_tokens,
        host_tokens=cap.host_tokens,
        policy=system.policy,
        # HiCache's default: back up on insert, so a later demotion costs no copy
        write_through=system.host_tier,
        # one trusted client per namespace in these benchmarks: no cap below the whole pool
        namespace_cap_tokens=cap.device_tokens,
        prefetch=system.prefetch,
        prefetch_lookahead=system.prefetch_lookahead,
    )
    policy = None
    if system.policy == "belady":
        if future is None:
            raise ValueError("the belady system needs the future admission order (future=...)")
        policy = BeladyPolicy(future)
    if system.oracle and (paths is None or len(paths) != len(workload.instances)
                          or not all(isinstance(i, Instance) for i in workload.instances)):
        raise ValueError("the oracle system needs a graph workload and the paths of a previous run (paths=...)")
    sim = ServingSim(system, CostModel(hardware, model), config, limits=limits, policy=policy, on_submit=on_submit)
    stats = _learned_stats(system, workload)
    clients = [_client(inst, sim, stats, paths[k] if system.oracle and paths else None)
               for k, inst in enumerate(workload.instances)]
    phase = _Phase(sim, clients, warmup=workload.warmup)
    phase.begin()
    sim.events.run()
    if phase.ended < len(clients):
        raise RuntimeError(
            f"simulation of {system.name} on {workload.name} stalled: {phase.ended}/{len(clients)} workflows "
            f"finished, {len(sim.waiting)} requests waiting, {len(sim.running)} running")
    end = max(c.end_s for c in clients)
    after = sim.cache.stats.as_dict()
    stats = {k: after[k] - phase.stats_before[k] for k in after}
    requests = sum(c.calls for c in clients)
    prompt_tokens = sum(stats[k] for k in ("device_hit_tokens", "prefetch_hit_tokens", "host_hit_tokens",
                                           "recomputed_tokens"))
    return SimResult(
        system.name, workload.name, dict(workload.labels),
        latency_s=sum(c.end_s - c.start_s for c in clients) / len(clients),
        makespan_s=end - phase.t0, requests=requests, prompt_tokens=prompt_tokens, stats=stats,
        device_tokens=cap.device_tokens, host_tokens=cap.host_tokens,
        compute_busy_s=sim.busy.compute_s - phase.busy_before[0],
        h2d_busy_s=sim.h2d.busy_s - phase.busy_before[1], d2h_busy_s=sim.d2h.busy_s - phase.busy_before[2],
        admission_order=tuple(sim.admission_log),
        paths=tuple(tuple(c.path) for c in clients if isinstance(c, GraphClient)),
    )


def _learned_stats(system: System, workload: Workload) -> Any:
    """A copy of the workload's routing statistics, trained on its routing-only walks."""
    if not system.learned:
        return None
    if workload.branch_stats is None:
        raise ValueError(f"system {system.name} needs routing statistics: workload {workload.name!r} "
                         f"carries no branch_stats")
    stats = workload.branch_stats.copy()
    for inst in workload.instances:
        if isinstance(inst, Instance) and workload.train_runs:
            train(inst.spec, stats, seed=inst.seed + 1, runs=workload.train_runs)
    return stats


def _client(inst: Any, sim: ServingSim, stats: Any = None, future: Sequence[str] | None = None) -> Any:
    if isinstance(inst, Instance):
        if future is not None:
            return OracleClient(inst, sim, lambda c: None, future)
        return GraphClient(inst, sim, lambda c: None, stats)
    if isinstance(inst, TraceInstance):
        return TraceClient(inst, sim, lambda c: None)
    raise TypeError(f"cannot simulate a workload instance of type {type(inst).__name__}")


class _Phase:
    """Warm every instance, then start them all together and snapshot the counters."""

    def __init__(self, sim: ServingSim, clients: list[Any], warmup: bool) -> None:
        self.sim = sim
        self.clients = clients
        self.warmup = warmup
        self.pending = len(clients)
        self.ended = 0
        self.t0 = 0.0
        self.stats_before: dict[str, int] = {}
        self.busy_before = (0.0, 0.0, 0.0)

    def begin(self) -> None:
        if not self.warmup:
            self._measure()
            return
        for c in self.clients:
            c.on_end = self._warmed
            c.warmup()

    def _warmed(self, _: Any) -> None:
        self.pending -= 1
        if self.pending == 0:
            self._measure()

    def _ended(self, _: Any) -> None:
        self.ended += 1

    def _measure(self) -> None:
        sim = self.sim
        self.t0 = sim.events.now
        self.stats_before = sim.cache.stats.as_dict()
        self.busy_before = (sim.busy.compute_s, sim.h2d.busy_s, sim.d2h.busy_s)
        for c in self.clients:
            c.on_end = self._ended
            sim.events.schedule(self.t0 + c.inst.start_s, c.start)
