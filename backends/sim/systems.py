"""The systems compared: each one a configuration of the same simulator and the same cache brain.

========== ======== ========= ======== ============ ============================================
name       policy   host tier prefetch status-aware what it stands for
========== ======== ========= ======== ============ ============================================
gpu-only   lru      no        no       no           SGLang radix cache: evicted prefixes recomputed
hicache    lru      yes       no       no           SGLang + HiCache: host hits loaded at admission
kvflow-evict kvflow yes       no       no           workflow-aware eviction alone (paper ablation)
kvflow     kvflow   yes       yes      yes          eviction + overlapped prefetch + status-aware
kvflow-learned kvflow yes     yes      yes          kvflow with expected steps from learned routing
belady     belady   yes       yes      yes          offline-optimal eviction, same prefetch
oracle     belady   yes       yes      yes          offline-optimal eviction + prefetch from the
                                                    realized future (perfect routing prediction)
infinite   kvflow   (none)    no       no           device pool holding everything: lower bound
========== ======== ========= ======== ============ ============================================

Hints are sent to the brain by every system (as a kvflow client always does): systems whose
policy ignores them behave as their baseline, and the prefetch planner needs them. ``infinite``
runs the kvflow policy because its extra room holds exactly the fixed prefixes: that policy sheds
the never-reused dynamic suffixes first, so no prefix is ever recomputed or loaded.
``kvflow-learned`` drives each tracker with the workload's routing statistics (learned online,
from the workload's prior): its hints carry expected steps instead of the static ones.
``oracle`` is the ceiling of any predictor inside this brain: its hints carry each agent's true
distance (in calls) to its next call, read from the path the ``kvflow`` run took (every system
takes the same path), prefetched with the learned lookahead and evicted by Bélády. It is a bound
for the analysis of routed workloads, not in the default set (``--systems oracle`` or the routed
table ask for it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["System", "SYSTEMS", "SYSTEM_NAMES", "DEFAULT_SYSTEMS", "get_system", "LEARNED_LOOKAHEAD"]

LEARNED_LOOKAHEAD = 16
"""Prefetch lookahead of ``kvflow-learned``: expected steps of branch candidates are fractional and
above 1 (the next worker of a supervisor is expected at ``E[T | runs] / P(runs)``), so the static
lookahead of 1 would prefetch nothing; the brain loads candidates most likely first and only into
room held by less likely ones, so a wider lookahead fills the device pool by likelihood."""


@dataclass(frozen=True)
class System:
    """``status_aware``: a request whose prefix is still loading is skipped so ready requests run;
    without it the scheduler admits requests in order and a pending load stalls the batch."""

    name: str
    policy: str
    host_tier: bool
    prefetch: bool
    status_aware: bool
    infinite: bool = False
    learned: bool = False
    prefetch_lookahead: int = 1
    oracle: bool = False


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("gpu-only", "lru", host_tier=False, prefetch=False, status_aware=False),
        System("hicache", "lru", host_tier=True, prefetch=False, status_aware=False),
        System("kvflow-evict", "kvflow", host_tier=True, prefetch=False, status_aware=False),
        System("kvflow", "kvflow", host_tier=True, prefetch=True, status_aware=True),
        System("kvflow-learned", "kvflow", host_tier=True, prefetch=True, status_aware=True, learned=True,
               prefetch_lookahead=LEARNED_LOOKAHEAD),
        System("belady", "belady", host_tier=True, prefetch=True, status_aware=True),
        System("oracle", "belady", host_tier=True, prefetch=True, status_aware=True, oracle=True,
               prefetch_lookahead=LEARNED_LOOKAHEAD),
        System("infinite", "kvflow", host_tier=False, prefetch=False, status_aware=False, infinite=True),
    )
}
SYSTEM_NAMES: tuple[str, ...] = tuple(SYSTEMS)
DEFAULT_SYSTEMS: tuple[str, ...] = tuple(n for n in SYSTEM_NAMES if n != "oracle")
"""What a run compares unless told otherwise (``oracle`` needs a graph workload's path)."""


def get_system(name: str) -> System:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEM_NAMES)}") from None
