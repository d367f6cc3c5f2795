"""The simulated orchestrator: drives each workflow instance's StepTracker like the runtime does.

For every node the tracker triggers, an LLM node becomes one :class:`~.engine.SimRequest` carrying
a :class:`KVFlowHint` with the steps of every agent *at call time* (the same call the runtime
makes); a plain function node finishes at once. Routing at conditional edges follows
:class:`~.workloads.WorkflowSpec`'s ``loop_limit`` and ``routing`` rules with the instance's own
seeded random stream, so an instance takes the same path in every simulated system. With routing
statistics (``kvflow-learned``) every decision is observed and the tracker answers expected steps,
which follow the statistics while the instance runs (learned online, shared by every instance).
"""

from __future__ import annotations

import math
import random
from typing import Callable, Iterable, Sequence

from kvflow_orch.constants import END, START
from kvflow_orch.hinting import WorkflowHints

from .serving import ServingSim, SimRequest
from .workloads import Instance, random_tokens

__all__ = ["WarmingClient", "GraphClient", "OracleClient", "FutureSteps", "Router", "train"]


class Router:
    """The routing rule of :class:`~.workloads.WorkflowSpec` over one random stream."""

    def __init__(self, spec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.end_passes = 0

    def choose(self, node: str) -> list[str] | None:
        branches = self.spec.asg.branches_of(node)
        if not branches:
            return None
        goto: list[str] = []
        for branch in branches:
            targets = list(branch.targets)
            if END in targets:
                self.end_passes += 1
                if self.end_passes >= self.spec.loop_limit:
                    goto.append(END)
                    continue
                targets.remove(END)
            weights = self.spec.routing.get(node)
            if weights:
                goto.append(self.rng.choices(targets, [weights.get(t, 0.0) for t in targets])[0])
            else:
                goto.append(self.rng.choice(targets))
        return goto


def train(spec, stats, seed: int, runs: int) -> None:
    """Walk ``runs`` instances of ``spec``'s graph (routing only, no requests) and observe every
    decision into ``stats``."""
    rng = random.Random(seed)
    for _ in range(runs):
        router, tracker = Router(spec, rng), spec.asg.tracker()
        if tracker.running.get(START):
            goto = router.choose(START)
            stats.observe(spec.asg.name, START, goto)
            tracker.finish(START, goto=goto)
        steps = 0
        while not tracker.done and steps < 10_000:
            node = min(tracker.triggered)
            tracker.start(node)
            goto = router.choose(node)
            if goto is not None:
                stats.observe(spec.asg.name, node, goto)
            tracker.finish(node, goto=goto)
            steps += 1


class WarmingClient:
    """Warm-up shared by every simulated client: one call per agent, in sequence, before the
    measured phase (the paper pre-warms every agent so its prefix is cached and backed up)."""

    sim: ServingSim
    on_end: Callable[..., None]

    def warm_agents(self) -> list[str]:
        raise NotImplementedError

    def warm_request(self, agent: str, on_done: Callable[[SimRequest], None]) -> SimRequest:
        raise NotImplementedError

    def warmup(self) -> None:
        self._warm_queue = self.warm_agents()
        self._warm_next()

    def _warm_next(self, _: SimRequest | None = None) -> None:
        if not self._warm_queue:
            self.on_end(self)
            return
        self.sim.submit(self.warm_request(self._warm_queue.pop(0), self._warm_next))


class GraphClient(WarmingClient):
    """One workflow instance. ``warmup()`` runs each agent once (fixed prompt + a fresh dynamic
    part, one output token) in sequence; ``start()`` runs the workflow; ``on_end(client)`` fires
    when either phase completes."""

    def __init__(self, instance: Instance, sim: ServingSim, on_end: Callable[["GraphClient"], None],
                 branch_stats: object = None) -> None:
        self.inst = instance
        self.spec = instance.spec
        self.sim = sim
        self.on_end = on_end
        self.rng = random.Random(instance.seed)
        self.router = Router(self.spec, self.rng)
        self.branch_stats = branch_stats
        self.hints = WorkflowHints(instance.workflow_id, instance.namespace)
        self.tracker = self.spec.asg.tracker(branch_stats)
        self.calls = 0
        self.path: list[str] = []  # the agents of the measured calls, in order
        self.start_s = 0.0
        self.end_s = 0.0

    def warm_agents(self) -> list[str]:
        return sorted(self.spec.asg.agents)

    def warm_request(self, agent: str, on_done: Callable[[SimRequest], None]) -> SimRequest:
        return self._request(agent, output=1, on_done=on_done)

    # ---- the workflow ----------------------------------------------------------------------
    def start(self) -> None:
        self.start_s = self.sim.events.now
        if self.tracker.running.get(START):
            self.tracker.finish(START, goto=self._choose(START))
        self._launch()

    def _launch(self) -> None:
        for node in sorted(self.tracker.triggered):
            self.tracker.start(node)
            agent = self.spec.asg.agent_of(node)
            if agent is None:  # plain Python node: no LLM, no time
                self._finished_node(node)
                return
            self.calls += 1
            self.path.append(agent)
            self.sim.submit(self._request(agent, self.spec.output_tokens, lambda r, n=node: self._finished_node(n),
                                          measured=True))
        if self.tracker.done:
            self.end_s = self.sim.events.now
            self.sim.steps_update(self.hints.update(done=True))
            self.on_end(self)

    def _finished_node(self, node: str) -> None:
        self.tracker.finish(node, goto=self._choose(node))
        self._launch()

    def _choose(self, node: str) -> list[str] | None:
        goto = self.router.choose(node)
        if goto is not None and self.branch_stats is not None:
            self.branch_stats.observe(self.spec.asg.name, node, goto)
        return goto

    def _steps_source(self, measured: bool) -> object:
        return self.tracker

    def _request(self, agent: str, output: int, on_done: Callable[[SimRequest], None],
                 measured: bool = False) -> SimRequest:
        fixed = self.spec.fixed[agent]
        prompt = fixed + random_tokens(self.rng, self.spec.dynamic_tokens)
        # as the runtime's [system, user] call
        hint = self.hints.hint(self._steps_source(measured), agent, fixed_prefix=1)  # type: ignore[arg-type]
        return SimRequest(prompt, random_tokens(self.rng, output), (self.inst.namespace, agent), len(fixed), hint,
                          on_done)


class FutureSteps:
    """Steps read from the future: each agent's distance, in calls, from call ``position`` of
    ``path`` to its next call (0 for the agent of that call; ``inf`` if it is not called again)."""

    def __init__(self, path: Sequence[str], position: int, agents: Iterable[str]) -> None:
        self.path, self.position, self.agents = path, position, tuple(agents)

    def agent_steps(self) -> dict[str, float]:
        out = dict.fromkeys(self.agents, math.inf)
        for j in range(len(self.path) - 1, self.position - 1, -1):
            out[self.path[j]] = j - self.position
        return out


class OracleClient(GraphClient):
    """A :class:`GraphClient` whose measured calls carry :class:`FutureSteps` from ``future`` (the
    path this instance took in a previous run: routing draws from the instance's own seeded stream,
    so every run takes it); a call that leaves that path raises RuntimeError."""

    def __init__(self, instance: Instance, sim: ServingSim, on_end: Callable[["GraphClient"], None],
                 future: Sequence[str]) -> None:
        super().__init__(instance, sim, on_end)
        self.future = tuple(future)

    def _steps_source(self, measured: bool) -> object:
        if not measured:
            return self.tracker
        i = len(self.path) - 1
        if i >= len(self.future) or self.future[i] != self.path[i]:
            raise RuntimeError(f"oracle: {self.inst.workflow_id} left the recorded path at call {i}")
        return FutureSteps(self.future, i, self.spec.asg.agents)
