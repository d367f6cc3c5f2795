"""The paper's synthetic sequential workflow (KVFlow §4): N stages run one after another, the whole
sequence repeated for ``rounds`` rounds.

* Each agent's fixed prompt is ``fixed`` tokens of deterministic filler; each call's dynamic part is
  ``dynamic`` tokens of filler that changes every round; replies are capped at ``output`` tokens.
  Token counts are exact for SmolLM2 (see :mod:`workflows._filler`); ``fixed`` counts the system
  message content (the chat template adds a few tokens around it).
* ``branches > 1`` (the camera-ready variant): every stage has ``branches`` agents whose fixed
  prompts share their first half; a deterministic router picks one per stage and round, so the
  steps-to-execution of the candidates are equal and the backend must keep (or prefetch) all of them.

Nodes are named ``s00`` .. (``s00_b0``, ``s00_b1`` .. with branches); the state key ``round``
counts finished rounds and ``last`` holds the latest reply.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from kvflow_orch import END, START, Workflow

from ._filler import filler

__all__ = ["synthetic", "workflow", "stage_agents"]


def stage_agents(n_agents: int, branches: int) -> list[list[str]]:
    """Node names per stage."""
    if branches == 1:
        return [[f"s{i:02d}"] for i in range(n_agents)]
    return [[f"s{i:02d}_b{b}" for b in range(branches)] for i in range(n_agents)]


def _pick(stage: int, round_: int, branches: int) -> int:
    digest = hashlib.sha256(f"{stage}:{round_}".encode()).digest()
    return digest[0] % branches


def synthetic(
    n_agents: int = 10,
    fixed: int = 4096,
    dynamic: int = 32,
    output: int = 32,
    rounds: int = 10,
    branches: int = 1,
    app: str = "",
) -> Workflow:
    """``app``: a label that gives this instance's agents fixed prompts of their own (the paper's
    independent, non-sharing concurrent workflows); empty (the default) keeps the shared ones."""
    for name, value in (("n_agents", n_agents), ("rounds", rounds), ("branches", branches), ("output", output)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"synthetic: {name} must be a positive integer, got {value!r}")
    if fixed < 0 or dynamic < 0:
        raise ValueError("synthetic: fixed and dynamic must be >= 0")
    wf = Workflow(f"synthetic-{n_agents}x{rounds}-b{branches}" + (f"-{app}" if app else ""))
    stages = stage_agents(n_agents, branches)
    shared = fixed // 2 if branches > 1 else 0
    for s, names in enumerate(stages):
        last_stage = s == n_agents - 1
        for name in names:
            own = ("fixed", name, app) if app else ("fixed", name)
            system = " ".join(p for p in (filler(shared, ("shared", s)), filler(fixed - shared, own)) if p)
            wf.agent(name, system=system, max_tokens=output)(_agent_fn(name, dynamic, last_stage))
    if branches == 1:
        wf.add_edge(START, stages[0][0])
    else:
        wf.add_conditional_edges(START, _router(0, branches, stages, rounds), stages[0])
    for s, names in enumerate(stages):
        nxt = (s + 1) % n_agents
        targets = stages[nxt] + ([END] if nxt == 0 else [])
        for name in names:
            if len(targets) == 1:
                wf.add_edge(name, targets[0])
            else:
                wf.add_conditional_edges(name, _router(nxt, branches, stages, rounds), targets)
    return wf


def _agent_fn(name: str, dynamic: int, last_stage: bool):
    async def call(ctx: Any, state: Mapping[str, Any]) -> dict[str, Any]:
        round_ = state.get("round", 0)
        reply = await ctx.llm(filler(dynamic, ("dynamic", name, round_, state.get("seed", 0))))
        return {"last": reply, "round": round_ + 1 if last_stage else round_}

    call.__name__ = name
    return call


def _router(stage: int, branches: int, stages: list[list[str]], rounds: int):
    def route(state: Mapping[str, Any]) -> str:
        round_ = state.get("round", 0)
        if stage == 0 and round_ >= rounds:
            return END
        return stages[stage][_pick(stage, round_, branches)]

    return route


#: the paper's default shape, small enough to run on a CPU: ``kvflow graph workflows.synthetic:workflow``
workflow = synthetic(n_agents=10, fixed=512, dynamic=32, output=32, rounds=3)
