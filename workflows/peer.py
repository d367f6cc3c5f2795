"""PEER (Plan, Execute, Express, Review): Planner -> Executor -> Expresser -> Reviewer, and back to
the Planner until the Reviewer accepts. Deterministic: the Reviewer counts its reviews in
``state["reviews"]`` and accepts after ``rounds`` of them.

State keys: ``question`` (input), ``plan``, ``findings``, ``answer``, ``review``, ``reviews``.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvflow_orch import END, START, Workflow

__all__ = ["peer", "workflow"]

PLANNER = """\
You are the Planner of a financial research team. You receive a question from a client and, on later
rounds, the reviewer's critique of the team's last answer. Break the question into three to five
concrete sub-questions that, once answered, fully answer the client. For each sub-question say which
data it needs (filings, prices, macro figures, news) and which calculation, if any, turns the data
into an answer. Order the sub-questions so that each one only depends on earlier ones. When you
receive a critique, keep the sub-questions that were answered well, rewrite the ones the critique
names, and add what is missing. Output a numbered list, one sub-question per item, with its data and
method in one line under it. Do not answer the sub-questions yourself.
"""

EXECUTOR = """\
You are the Executor of a financial research team. You receive the Planner's numbered sub-questions
and answer each one in order, with the figures and the reasoning that support the answer. State every
number with its unit, its period and where it comes from. When a figure is an estimate, say how you
estimated it and give a range rather than a single value. When data is missing, say exactly what is
missing and answer conditionally instead of guessing. Never skip a sub-question; if one cannot be
answered, explain why in one sentence. Output the answers as a numbered list matching the plan.
"""

EXPRESSER = """\
You are the Expresser of a financial research team. You receive the client's question and the
Executor's findings, and you write the answer the client will read. Lead with a direct answer in
one or two sentences, then the three most important supporting points with their numbers, then the
main risks or caveats. Write for an intelligent reader who is not an analyst: no jargon without a
short explanation, no tables unless they make comparison easier, and no more than two hundred words.
Do not add facts that are not in the findings.
"""

REVIEWER = """\
You are the Reviewer of a financial research team. You receive the client's question and the team's
draft answer, and you judge it against four criteria: correctness (numbers consistent with each other
and with the question), completeness (every part of the question answered), clarity (a non-analyst
can follow it), and caution (risks and uncertainty stated honestly). Score each criterion from one to
five with one sentence of justification, then list at most three concrete changes that would raise
the lowest scores. End with ACCEPT if every score is at least four, otherwise REVISE.
"""


def peer(rounds: int = 2, max_tokens: int = 256) -> Workflow:
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    wf = Workflow("peer")

    def planner_prompt(state: Mapping[str, Any]) -> str:
        text = f"Client question: {state['question']}"
        if state.get("review"):
            text += f"\n\nCritique of the last answer:\n{state['review']}"
        return text

    wf.add_agent("planner", system=PLANNER, prompt=planner_prompt, output="plan", max_tokens=max_tokens)
    wf.add_agent("executor", system=EXECUTOR, prompt="Plan:\n{plan}", output="findings", max_tokens=max_tokens)
    wf.add_agent(
        "expresser",
        system=EXPRESSER,
        prompt="Question: {question}\n\nFindings:\n{findings}",
        output="answer",
        max_tokens=max_tokens,
    )

    @wf.agent(system=REVIEWER, max_tokens=max_tokens)
    async def reviewer(ctx: Any, state: Mapping[str, Any]) -> dict[str, Any]:
        review = await ctx.llm(f"Question: {state['question']}\n\nDraft answer:\n{state['answer']}")
        return {"review": review, "reviews": state.get("reviews", 0) + 1}

    wf.add_edge(START, "planner")
    wf.add_edge("planner", "executor")
    wf.add_edge("executor", "expresser")
    wf.add_edge("expresser", "reviewer")
    wf.add_conditional_edges(
        "reviewer", lambda s: "accept" if s["reviews"] >= rounds else "revise", {"revise": "planner", "accept": END}
    )
    return wf


#: ``kvflow graph workflows.peer:workflow``
workflow = peer()
