"""Many simulated workers behind a gateway: routing rules, steps to the serving workers, a worker lost.

Each worker is a :class:`~.serving.ServingSim` with its own cache brain and compute stream, all on
one event queue. :class:`SimGateway` stands where a :class:`~.serving.ServingSim` would for the
simulated clients (:class:`~.orchestrator.GraphClient` calls ``submit``, ``steps_update`` and reads
``events``) and routes every request as smg does:

* ``round_robin``: the next worker in turn; hints are dropped (a plain client, the baseline);
* ``workflow`` / ``agent``: sticky by ``<namespace>/<workflow_id>`` or ``<namespace>/<agent>``
  (a stable hash, as the gateway's manual policy keeps a key on the worker it first chose), with the
  hint in the request; steps updates go to the workers that served the workflow, ``done`` to all.

:meth:`SimGateway.fail` kills a worker at a given time: the requests it held are resubmitted to the
survivors (their keys are routed again), and what it would still have produced is discarded.
:func:`simulate_cluster` measures the fixed-prompt device hit ratio: over every call, the fixed-prefix
tokens found cached on the worker that served it, over all fixed-prefix tokens (no host tier, so a
cached token is a device token).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Literal

from backends.kvcache import CacheConfig
from kvflow_orch.protocol import StepsUpdate

from .cost import CostModel
from .events import EventQueue
from .orchestrator import GraphClient
from .profiles import HardwareProfile, ModelProfile
from .serving import EngineLimits, ServingSim, SimRequest
from .systems import System
from .workloads import Instance, Workload

__all__ = ["ROUTINGS", "SimGateway", "ClusterResult", "simulate_cluster"]

Routing = Literal["round_robin", "workflow", "agent"]
ROUTINGS: tuple[str, ...] = ("round_robin", "workflow", "agent")
WORKER_SYSTEM = System("worker", "kvflow", host_tier=False, prefetch=False, status_aware=False)


class SimGateway:
    def __init__(self, workers: list[ServingSim], events: EventQueue, routing: Routing) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        self.workers = workers
        self.events = events
        self.routing = routing
        self.alive = [True] * len(workers)
        self.fixed_tokens = 0
        self.fixed_hit_tokens = 0
        self.rerouted = 0
        self._turn = 0
        self._served: dict[tuple[str, str], set[int]] = {}
        self._held: dict[int, dict[int, tuple[SimRequest, SimRequest]]] = {i: {} for i in range(len(workers))}

    # ---- routing ---------------------------------------------------------------------------
    def _pick(self, request: SimRequest) -> int:
        live = [i for i, ok in enumerate(self.alive) if ok]
        if not live:
            raise RuntimeError("no worker is left to serve the request")
        if self.routing == "round_robin" or request.hint is None:
            self._turn += 1
            return live[self._turn % len(live)]
        hint = request.hint
        key = f"{hint.namespace}/{hint.workflow_id if self.routing == 'workflow' else hint.agent}"
        first = zlib.crc32(key.encode()) % len(self.workers)
        # A lost worker's keys move on to the next live worker, the others stay where they were.
        n = len(self.workers)
        return next(i % n for i in range(first, first + n) if self.alive[i % n])

    def submit(self, request: SimRequest) -> None:
        if self.routing == "round_robin":
            request = dataclasses.replace(request, hint=None)
        index = self._pick(request)
        copy = dataclasses.replace(request, on_done=lambda r, i=index: self._done(i, r))
        self._held[index][id(copy)] = (request, copy)
        if request.hint is not None:
            served = self._served.setdefault((request.hint.namespace, request.hint.workflow_id), set())
            served.add(index)  # the hint carries the workflow's current steps to a new worker
        self.workers[index].submit(copy)

    def _done(self, index: int, copy: SimRequest) -> None:
        if not self.alive[index]:
            return  # a dead worker's output never reaches the client
        original, _ = self._held[index].pop(id(copy))
        self.fixed_tokens += copy.fixed_tokens
        self.fixed_hit_tokens += min(copy.cached_tokens, copy.fixed_tokens)
        original.on_done(original)

    def steps_update(self, update: StepsUpdate) -> None:
        key = (update.namespace, update.workflow_id)
        targets = range(len(self.workers)) if update.done else sorted(self._served.get(key, ()))
        if update.done:
            self._served.pop(key, None)
        for i in targets:
            if self.alive[i]:
                self.workers[i].steps_update(update)

    # ---- failures --------------------------------------------------------------------------
    def fail(self, index: int) -> None:
        """Kill worker ``index`` now; the calls it held are sent again to the survivors."""
        self.alive[index] = False
        held, self._held[index] = self._held[index], {}
        for original, _ in held.values():
            self.rerouted += 1
            self.submit(original)


@dataclass(frozen=True)
class ClusterResult:
    routing: str
    workers: int
    device_tokens: int
    calls: int
    fixed_tokens: int
    fixed_hit_tokens: int
    workflows_finished: int
    workflows: int
    rerouted: int
    makespan_s: float
    tables_left: int
    """Workflows still in the live workers' hint tables at the end (0: ``done`` reached every one)."""

    @property
    def fixed_hit_ratio(self) -> float:
        return self.fixed_hit_tokens / self.fixed_tokens if self.fixed_tokens else 0.0

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "fixed_hit_ratio": round(self.fixed_hit_ratio, 4)}


def simulate_cluster(workload: Workload, hardware: HardwareProfile, model: ModelProfile, *, workers: int,
                     routing: Routing, device_tokens: int, fail: tuple[int, float] | None = None,
                     limits: EngineLimits = EngineLimits()) -> ClusterResult:
    """Run ``workload``'s graph instances (no warm-up) on ``workers`` workers of ``device_tokens``
    each; ``fail=(index, at_s)`` kills worker ``index`` at ``at_s`` simulated seconds."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if fail is not None and not 0 <= fail[0] < workers:
        raise ValueError(f"fail names worker {fail[0]}, but there are {workers} (0..{workers - 1})")
    events = EventQueue()
    config = CacheConfig(device_tokens=device_tokens, host_tokens=0, policy="kvflow",
                         namespace_cap_tokens=device_tokens, prefetch=False)
    cost = CostModel(hardware, model)
    sims = [ServingSim(WORKER_SYSTEM, cost, config, limits=limits, events=events) for _ in range(workers)]
    gateway = SimGateway(sims, events, routing)
    finished: list[GraphClient] = []
    clients = []
    for inst in workload.instances:
        if not isinstance(inst, Instance):
            raise TypeError(f"simulate_cluster runs graph instances, got {type(inst).__name__}")
        client = GraphClient(inst, gateway, finished.append)  # type: ignore[arg-type]
        clients.append(client)
        events.schedule(inst.start_s, client.start)
    if fail is not None:
        events.schedule(fail[1], gateway.fail, fail[0])
    events.run()
    return ClusterResult(routing, workers, device_tokens, sum(c.calls for c in clients), gateway.fixed_tokens,
                         gateway.fixed_hit_tokens, len(finished), len(clients), gateway.rerouted, events.now,
                         sum(sim.cache.usage()["workflows"] for sim, ok in zip(sims, gateway.alive, strict=True) if ok))
