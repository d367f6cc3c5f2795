"""A MetaGPT-style software company: ProductManager -> Architect -> ProjectManager -> Engineer,
then an Engineer <-> QA fix loop.

Each role has a realistic fixed prompt of 700-900 SmolLM2 tokens (:mod:`workflows.metagpt_roles`);
the dynamic part of each call is the work handed over so far. The loop is deterministic: QA counts
its reviews in ``state["qa_rounds"]`` and sends the code back for ``fix_rounds`` fixes, then ships.

    kvflow run workflows.metagpt:workflow --input '{"idea": "a command-line todo app"}'

With ``backlog=True`` the company works through a list of ideas, one project after another, in one
workflow: when QA ships a project and ideas remain, the ProductManager starts the next one. Every
role's fixed prompt then recurs once per project, and the steps-to-execution say which role comes
back first (the input is ``{"ideas": [...]}``; ``kvflow demo`` runs this variant)::

    kvflow run workflows.metagpt:backlog_workflow --input '{"ideas": ["a todo app", "a unit converter"]}'

State keys: ``idea`` (input), ``prd``, ``design``, ``plan``, ``code``, ``review``, ``qa_rounds``;
with a backlog ``ideas`` (input) instead of ``idea``, and ``started`` (projects begun).
"""

from __future__ import annotations

from typing import Any, Mapping

from kvflow_orch import END, START, Workflow, WorkflowError

from .metagpt_roles import ARCHITECT, ENGINEER, PRODUCT_MANAGER, PROJECT_MANAGER, QA_ENGINEER

__all__ = ["metagpt", "workflow", "backlog_workflow", "ROLE_NODES"]

ROLE_NODES = ("product_manager", "architect", "project_manager", "engineer", "qa")


def _engineer_prompt(state: Mapping[str, Any]) -> str:
    parts = [f"System design:\n{state['design']}", f"Project plan:\n{state['plan']}"]
    if state.get("review"):
        parts += [f"Your previous code:\n{state['code']}", f"QA review to address:\n{state['review']}"]
    else:
        parts.append("Write the code for every file of the plan.")
    return "\n\n".join(parts)


def _add_backlog_manager(wf: Workflow, max_tokens: int) -> None:
    """The ProductManager of a backlog: takes the next idea and starts its project afresh (no QA
    rounds, no review: the Engineer writes new code)."""

    @wf.agent(system=PRODUCT_MANAGER, max_tokens=max_tokens)
    async def product_manager(ctx: Any, state: Mapping[str, Any]) -> dict[str, Any]:
        started = state.get("started", 0)
        ideas = state.get("ideas")
        if not isinstance(ideas, list) or not ideas or not all(isinstance(i, str) for i in ideas):
            raise WorkflowError("the backlog workflow's input needs 'ideas': a non-empty list of strings, "
                                f"got {ideas!r}")
        prd = await ctx.llm(f"Idea: {ideas[started]}")
        return {"prd": prd, "started": started + 1, "qa_rounds": 0, "review": ""}


def metagpt(fix_rounds: int = 2, max_tokens: int = 256, *, backlog: bool = False) -> Workflow:
    """The workflow; per project the Engineer runs ``fix_rounds + 1`` times and QA as often."""
    if not isinstance(fix_rounds, int) or fix_rounds < 0:
        raise ValueError(f"fix_rounds must be an integer >= 0, got {fix_rounds!r}")
    wf = Workflow("metagpt-backlog" if backlog else "metagpt")
    if backlog:
        _add_backlog_manager(wf, max_tokens)
    else:
        wf.add_agent("product_manager", system=PRODUCT_MANAGER, prompt="Idea: {idea}", output="prd",
                     max_tokens=max_tokens)
    wf.add_agent(
        "architect",
        system=ARCHITECT,
        prompt="Product requirement document:\n{prd}",
        output="design",
        max_tokens=max_tokens,
    )
    wf.add_agent(
        "project_manager",
        system=PROJECT_MANAGER,
        prompt="PRD:\n{prd}\n\nSystem design:\n{design}",
        output="plan",
        max_tokens=max_tokens,
    )
    wf.add_agent("engineer", system=ENGINEER, prompt=_engineer_prompt, output="code", max_tokens=max_tokens)

    @wf.agent(system=QA_ENGINEER, max_tokens=max_tokens)
    async def qa(ctx: Any, state: Mapping[str, Any]) -> dict[str, Any]:
        review = await ctx.llm(f"PRD:\n{state['prd']}\n\nCode under review:\n{state['code']}")
        return {"review": review, "qa_rounds": state.get("qa_rounds", 0) + 1}

    def after_review(state: Mapping[str, Any]) -> str:
        if state["qa_rounds"] <= fix_rounds:
            return "fix"
        return "next" if backlog and state["started"] < len(state["ideas"]) else "ship"

    wf.add_edge(START, "product_manager")
    wf.add_edge("product_manager", "architect")
    wf.add_edge("architect", "project_manager")
    wf.add_edge("project_manager", "engineer")
    wf.add_edge("engineer", "qa")
    targets = {"fix": "engineer", "ship": END, **({"next": "product_manager"} if backlog else {})}
    wf.add_conditional_edges("qa", after_review, targets)
    return wf


#: ``kvflow graph workflows.metagpt:workflow``
workflow = metagpt()

#: ``kvflow run workflows.metagpt:backlog_workflow --input '{"ideas": ["a todo app", "a unit converter"]}'``
backlog_workflow = metagpt(backlog=True)
