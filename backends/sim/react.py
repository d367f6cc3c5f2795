"""ReAct agents with tool pauses, simulated: the workload of issue 24's continuations.

Each agent runs a loop of model calls; between two calls it runs a tool whose duration is drawn
from the tool's range (:data:`FAST_TOOL` 0.1-1 s, :data:`SLOW_TOOL` 5-30 s, as in the issue), then
calls again with its whole conversation plus the tool's result. A job's completion time runs from
its first call's arrival to its last call's last token. The plan (:func:`react_plan`) is pure data
from a seed, so every policy sees the same token content and the same tool durations.

Every agent is a kvflow client: its hint names its job as the workflow and declares its system
prompt as the fixed prefix; its session is that agent in its job (:mod:`backends.kvcache.continuations`);
when the job ends its client sends ``done`` for it.
With continuations the host reports each tool-call ending (:meth:`KVCache.pause
<backends.kvcache.KVCache.pause>`), as the server does on parsing a reply; without them the same
requests run with ``continuations=False``. With ``exact_resume`` each pause is announced with the
tool's exact duration (``resume_in_s``): the best an online policy can know of a pause, the bound
beside which the learned durations are judged. With ``known_durations`` the brain is told each
tool's distribution instead (:class:`KnownDurations`), not its samples: the distribution-aware
online ranking, what learning the durations can reach at best. Each run records the schedule it executed
(:class:`~backends.kvcache.trace.ScheduleRecorder`), for Bélády on that very schedule
(:func:`~backends.kvcache.trace.replay_schedule`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from statistics import mean
from typing import Any, Sequence

from backends.kvcache import CacheConfig, EvictionPolicy
from backends.kvcache.continuations import TOOL_WINDOW, ToolDurations
from backends.kvcache.trace import ScheduleRecorder
from kvflow_orch.protocol import DEFAULT_NAMESPACE, KVFlowHint, StepsUpdate

from .cost import CostModel
from .serving import EngineLimits, ServingSim, SimRequest
from .systems import System
from .workloads import random_tokens as sim_tokens

__all__ = ["Tool", "FAST_TOOL", "SLOW_TOOL", "ReactSpec", "AgentPlan", "react_plan", "ReactResult", "KnownDurations",
           "run_react"]


@dataclass(frozen=True)
class Tool:
    name: str
    low_s: float
    high_s: float


FAST_TOOL = Tool("lookup", 0.1, 1.0)
SLOW_TOOL = Tool("build", 5.0, 30.0)


@dataclass(frozen=True)
class ReactSpec:
    """``agents`` concurrent ReAct jobs of ``turns`` model calls; each tool call is slow with
    probability ``slow_share``. Token counts per part of a conversation."""

    agents: int = 16
    turns: int = 4
    system_tokens: int = 256
    task_tokens: int = 64
    output_tokens: int = 32
    result_tokens: int = 48
    slow_share: float = 0.5
    stagger_s: float = 0.05
    seed: int = 0
    vocab: int | None = None
    """Token ids below this (a real model's vocabulary); ``None``: the simulator's."""


@dataclass(frozen=True)
class AgentPlan:
    name: str
    system: tuple[int, ...]
    task: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]
    """One reply per turn."""
    tools: tuple[tuple[Tool, float, tuple[int, ...]], ...]
    """Between turn ``i`` and ``i + 1``: the tool, its duration, its result's tokens."""
    start_s: float

    def prompt(self, turn: int) -> tuple[int, ...]:
        """The conversation sent at ``turn``: system prompt, task, then each earlier reply and its
        tool's result."""
        out = self.system + self.task
        for i in range(turn):
            out += self.outputs[i] + self.tools[i][2]
        return out


def react_plan(spec: ReactSpec) -> list[AgentPlan]:
    rng = random.Random(spec.seed)
    ids = None if spec.vocab is None else range(3, spec.vocab)  # past the special tokens of small vocabularies

    def random_tokens(rng: random.Random, n: int) -> tuple[int, ...]:
        return sim_tokens(rng, n) if ids is None else tuple(rng.choices(ids, k=n))

    plans = []
    for i in range(spec.agents):
        tools = []
        for _ in range(spec.turns - 1):
            tool = SLOW_TOOL if rng.random() < spec.slow_share else FAST_TOOL
            tools.append((tool, rng.uniform(tool.low_s, tool.high_s), random_tokens(rng, spec.result_tokens)))
        outputs = tuple(random_tokens(rng, spec.output_tokens) for _ in range(spec.turns))
        system, task = random_tokens(rng, spec.system_tokens), random_tokens(rng, spec.task_tokens)
        plans.append(AgentPlan(f"agent{i}", system, task, outputs, tuple(tools), i * spec.stagger_s))
    return plans


@dataclass(frozen=True)
class ReactResult:
    job_s: tuple[float, ...]
    """Each job's completion time, in plan order."""
    recomputed_tokens: int
    counters: dict[str, int]
    admissions: tuple[tuple[int, ...], ...]
    """Prompts in admission order (Bélády's future for a rerun)."""
    schedule: tuple[tuple[Any, ...], ...] = ()
    """The admissions and releases the run executed (:func:`~backends.kvcache.trace.replay_schedule`)."""

    @property
    def mean_job_s(self) -> float:
        return mean(self.job_s)

    def to_json(self) -> dict[str, Any]:
        return {"mean_job_s": self.mean_job_s, "recomputed_tokens": self.recomputed_tokens, **self.counters}


class KnownDurations(ToolDurations):
    """Each tool's duration distribution told to the brain from the start: its window holds
    :data:`~backends.kvcache.continuations.TOOL_WINDOW` evenly spaced quantiles of the tool's
    range (durations are drawn uniformly from it), and returns teach nothing (the window stays)."""

    def __init__(self, learned: ToolDurations, namespace: str, tools: Sequence[Tool]) -> None:
        super().__init__(learned.default_s, cold_hold_s=learned.cold_hold_s)
        for tool in tools:
            for i in range(TOOL_WINDOW):
                super().observe(namespace, tool.name, tool.low_s + (tool.high_s - tool.low_s) * (i + 0.5) / TOOL_WINDOW)

    def observe(self, namespace: str, tool: str, seconds: float) -> None:
        pass


def run_react(plans: Sequence[AgentPlan], system: System, cost: CostModel, config: CacheConfig, *,
              policy: EvictionPolicy | None = None, limits: EngineLimits = EngineLimits(),
              exact_resume: bool = False, known_durations: bool = False) -> ReactResult:
    """Run every plan's loop to the end on one simulated instance (``config.continuations`` says
    whether tool-call endings are kept; ``exact_resume``: each pause announces its tool's exact
    duration; ``known_durations``: the brain knows each tool's distribution, :class:`KnownDurations`)."""
    sim = ServingSim(system, cost, config, limits=limits, policy=policy)
    if known_durations:
        continuations = sim.cache.intake.continuations
        tools = sorted({tool for plan in plans for tool, _, _ in plan.tools}, key=lambda tool: tool.name)
        continuations.durations = KnownDurations(continuations.durations, DEFAULT_NAMESPACE, tools)
    recorder = ScheduleRecorder(sim.cache)
    done: dict[str, float] = {}

    def call(plan: AgentPlan, turn: int) -> None:
        hint = KVFlowHint(workflow_id=plan.name, agent=plan.name, steps={plan.name: 0})
        sim.submit(SimRequest(plan.prompt(turn), plan.outputs[turn], (hint.namespace, hint.agent),
                              len(plan.system), hint, lambda r: finished(plan, turn, r)))

    def finished(plan: AgentPlan, turn: int, request: SimRequest) -> None:
        if turn + 1 == len(plan.outputs):
            done[plan.name] = sim.events.now - plan.start_s
            # the job ended: its client says so (as the simulator's orchestrator does), and its
            # agent's fixed prompt is no longer protected
            sim.steps_update(StepsUpdate(workflow_id=plan.name, namespace=request.hint.namespace, done=True))
            return
        tool, seconds, _ = plan.tools[turn]
        session = request.intake.session
        if session is not None:
            sim.cache.pause(session, [tool.name], seconds if exact_resume else None)
        sim.events.schedule(sim.events.now + seconds, call, plan, turn + 1)

    for plan in plans:
        sim.events.schedule(plan.start_s, call, plan, 0)
    sim.events.run()
    missing = [p.name for p in plans if p.name not in done]
    if missing:
        raise RuntimeError(f"the simulation ended with unfinished jobs {missing[:4]}")
    counters = {k: v for k, v in sim.cache.intake.counters.items() if k.startswith("continuations_")}
    return ReactResult(tuple(done[p.name] for p in plans), sim.cache.stats.recomputed_tokens, counters,
                       tuple(sim.admission_log), tuple(recorder.events))
