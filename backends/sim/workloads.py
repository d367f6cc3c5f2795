"""Workloads: which workflows run, with which token content, in how many concurrent instances.

A :class:`Workload` is pure data, built deterministically from a seed, so every simulated system
sees exactly the same requests. Graph workloads carry a compiled Agent Step Graph handed in by the
caller (the simulator builds no workflows); the simulator's orchestrator drives its step tracker
just as the runtime does, so the steps in every hint are the ones the real orchestrator would send.
Replay workloads (:mod:`.replay`) carry recorded calls instead of a graph.

Token content is synthetic (as in the paper): each agent identity owns a fixed prefix of random
token ids; each call appends a fresh random dynamic suffix. Branch candidates of one stage share
the first half of their fixed prefix ("partially shared prefixes").
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from kvflow_orch.asg import AgentStepGraph

__all__ = [
    "VOCAB",
    "WorkflowSpec",
    "Instance",
    "Workload",
    "random_tokens",
    "text_tokens",
    "synthetic",
    "from_graph",
]

VOCAB = 32_000


@dataclass(frozen=True)
class WorkflowSpec:
    """A compiled workflow and the token content of its agents.

    ``asg`` is duck-typed: the simulator calls only ``tracker()``, ``agents``, ``agent_of``,
    ``branches_of``, ``system_prompt`` and ``name``, as a compiled ``AgentStepGraph`` offers them.

    ``fixed`` maps every agent identity to its fixed-prefix token ids. ``loop_limit`` bounds loops:
    each time a node finishes whose conditional edges offer END, the orchestrator counts one pass;
    it takes END on pass ``loop_limit`` and otherwise picks among the other targets, uniformly or by
    ``routing[node]`` (target -> weight; the skewed routers of the supervisor and swarm workloads)
    (so the synthetic workflow's loop back to its first stage runs ``rounds`` times).
    """

    asg: "AgentStepGraph"
    fixed: Mapping[str, tuple[int, ...]]
    dynamic_tokens: int
    output_tokens: int
    loop_limit: int = 1
    routing: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = set(self.asg.agents) - set(self.fixed)
        if missing:
            raise ValueError(f"workflow {self.asg.name!r}: no fixed tokens for agent(s) {sorted(missing)}")
        if self.dynamic_tokens < 1 or self.output_tokens < 1 or self.loop_limit < 1:
            raise ValueError("dynamic_tokens, output_tokens and loop_limit must be >= 1")


@dataclass(frozen=True)
class Instance:
    """One running copy of a workflow: its own id, namespace (client id) and random stream."""

    spec: WorkflowSpec
    workflow_id: str
    namespace: str
    seed: int
    start_s: float = 0.0

    @property
    def fixed(self) -> Mapping[str, tuple[int, ...]]:
        return self.spec.fixed


@dataclass(frozen=True)
class Workload:
    """``labels`` describe the configuration in reports (fixed/dynamic/output tokens, branches...).
    ``instances`` are graph :class:`Instance` s or recorded :class:`~.replay.TraceInstance` s; both
    expose ``fixed`` (agent -> fixed-prefix tokens), ``namespace`` and ``start_s``."""

    name: str
    instances: tuple[Any, ...]
    labels: Mapping[str, Any] = field(default_factory=dict)
    warmup: bool = True
    branch_stats: Any = None
    """The routing statistics the ``kvflow-learned`` system starts from (a ``BranchStats``-like
    object with ``copy()`` and ``observe()``, made by the caller); each run works on a copy."""
    train_runs: int = 0
    """Routing-only walks per graph instance observed into that copy before the measured phase
    (the traffic a deployed app has already seen); they use their own random stream."""

    def __post_init__(self) -> None:
        if not self.instances:
            raise ValueError(f"workload {self.name!r}: instances must be >= 1")

    @property
    def fixed_tokens_total(self) -> int:
        seen: dict[tuple[str, str], int] = {}
        for inst in self.instances:
            for agent, toks in inst.fixed.items():
                seen[(inst.namespace, agent)] = len(toks)
        return sum(seen.values())


_VOCAB_IDS = range(VOCAB)


def random_tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.choices(_VOCAB_IDS, k=n))


def text_tokens(text: str, chars_per_token: int = 4) -> tuple[int, ...]:
    """Stable token ids for a text: one id per ``chars_per_token`` characters (about what an English
    BPE produces), so texts that share a prefix share a token prefix."""
    return tuple(
        zlib.crc32(text[i : i + chars_per_token].encode()) % VOCAB for i in range(0, len(text), chars_per_token)
    )


def _synthetic_prompts(stages: Sequence[Sequence[str]], fixed: int, rng: random.Random) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for stage in stages:
        shared = random_tokens(rng, fixed // 2) if len(stage) > 1 else ()
        for agent in stage:
            out[agent] = shared + random_tokens(rng, fixed - len(shared))
    return out


def synthetic(
    asg: "AgentStepGraph",
    stages: Sequence[Sequence[str]],
    *,
    fixed: int = 4096,
    dynamic: int = 32,
    output: int = 32,
    rounds: int = 10,
    instances: int = 1,
    seed: int = 0,
) -> Workload:
    """The paper's single-workflow benchmark (``instances=1``) or its concurrent variant: several
    independent, non-sharing copies, each its own namespace (client id).

    ``asg`` is the paper's sequential workflow compiled (``workflows.synthetic``), ``stages`` its
    agents stage by stage (one list of branch candidates per stage, as ``stage_agents`` gives);
    candidates of a stage share the first half of their fixed prefix."""
    if fixed < 0:
        raise ValueError(f"synthetic: fixed must be >= 0, got {fixed}")
    n_agents, branches = len(stages), len(stages[0])
    rng = random.Random(seed)
    insts = []
    for k in range(instances):
        spec = WorkflowSpec(asg, _synthetic_prompts(stages, fixed, rng), dynamic, output, loop_limit=rounds)
        insts.append(Instance(spec, f"synthetic-{k}", f"client-{k}", seed=rng.randrange(2**31)))
    labels = {"fixed": fixed, "dynamic": dynamic, "output": output, "branches": branches,
              "agents": n_agents, "rounds": rounds, "instances": instances}
    return Workload("synthetic" if instances == 1 else "concurrent", tuple(insts), labels)


def from_graph(
    asg: "AgentStepGraph",
    *,
    name: str,
    dynamic: int = 64,
    output: int = 128,
    loop_limit: int = 3,
    instances: int = 1,
    tenant_header: int = 0,
    seed: int = 0,
    routing: Mapping[str, Mapping[str, float]] | None = None,
) -> Workload:
    """Any compiled workflow: fixed prefixes come from the agents' real system prompts (:func:`text_tokens`),
    so agents whose role texts share a preamble share a cached prefix, as they would on a server.
    ``tenant_header > 0`` gives each instance its own random header of that many tokens in front of
    every agent's prompt (per-tenant customised roles): the agents of one instance then share that
    partial prefix, and instances share nothing. ``routing``: skewed router weights (see
    :class:`WorkflowSpec`)."""
    if tenant_header < 0:
        raise ValueError(f"{name}: tenant_header must be >= 0, got {tenant_header}")
    roles = {agent: text_tokens(asg.system_prompt(agent)) or (0,) for agent in asg.agents}
    rng = random.Random(seed)
    insts = []
    for k in range(instances):
        header = random_tokens(rng, tenant_header)
        spec = WorkflowSpec(asg, {a: header + t for a, t in roles.items()}, dynamic, output, loop_limit,
                            dict(routing or {}))
        insts.append(Instance(spec, f"{name}-{k}", f"client-{k}", seed=rng.randrange(2**31)))
    labels = {"fixed": tenant_header + max(len(t) for t in roles.values()), "dynamic": dynamic,
              "output": output, "loops": loop_limit, "instances": instances, "agents": len(roles)}
    return Workload(name, tuple(insts), labels)
