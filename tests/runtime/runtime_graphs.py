"""Small workflows shared by the runtime tests, with the steps each call must carry.

Expected steps are derived by hand from the steps equations in kvflow_orch._steps for each graph.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from kvflow_orch import END, START, Workflow

INF = None  # wire form of "not expected again"


def review_loop(rounds: int = 2, max_tokens: int = 8) -> Workflow:
    """pm -> eng -> qa -> count (plain) -> {eng | END}; count decides after `rounds` reviews."""
    wf = Workflow("loop")
    wf.add_agent("pm", system="You are a PM.", prompt="Idea: {idea}", output="prd", max_tokens=max_tokens)
    wf.add_agent("eng", system="You are an engineer.", prompt="PRD: {prd}", output="code", max_tokens=max_tokens)
    wf.add_agent("qa", system="You are QA.", prompt="Code: {code}", output="review", max_tokens=max_tokens)
    wf.add_node("count", lambda s: {"rounds": s.get("rounds", 0) + 1})
    wf.add_edge(START, "pm")
    wf.add_edge("pm", "eng")
    wf.add_edge("eng", "qa")
    wf.add_edge("qa", "count")
    wf.add_conditional_edges("count", lambda s: "fix" if s["rounds"] < rounds else "ship", {"fix": "eng", "ship": END})
    return wf


# While pm runs: eng 1, qa 2. While eng runs: qa 1, and eng itself 0; pm can never run again.
# While qa runs: count 1, so eng (via the router) 2.
LOOP_HINTS = [
    ("pm", {"pm": 0, "eng": 1, "qa": 2}),
    ("eng", {"pm": INF, "eng": 0, "qa": 1}),
    ("qa", {"pm": INF, "eng": 2, "qa": 0}),
    ("eng", {"pm": INF, "eng": 0, "qa": 1}),
    ("qa", {"pm": INF, "eng": 2, "qa": 0}),
]


class FanState(TypedDict, total=False):
    topic: str
    parts: Annotated[list, operator.add]
    summary: str


def fan_out_join(max_tokens: int = 8) -> Workflow:
    """plan -> {w1, w2} concurrently -> AND-join -> merge."""
    wf = Workflow("fan", state=FanState)
    wf.add_agent("plan", system="Plan.", prompt="{topic}", output="plan", max_tokens=max_tokens)
    for w in ("w1", "w2"):
        wf.add_agent(w, system=f"Worker {w}.", prompt=lambda s, w=w: f"{w} works on {s['plan']}", max_tokens=max_tokens)
        wf.add_edge("plan", w)
    wf.add_node("collect_1", lambda s: {"parts": ["a"]})
    wf.add_node("collect_2", lambda s: {"parts": ["b"]})
    wf.add_edge("w1", "collect_1")
    wf.add_edge("w2", "collect_2")
    wf.add_edge(["collect_1", "collect_2"], "merge")
    wf.add_agent("merge", system="Merge.", prompt=lambda s: " + ".join(sorted(s["parts"])), output="summary",
                 max_tokens=max_tokens)
    wf.add_edge(START, "plan")
    return wf


FAN_HINTS = {
    # plan running: workers 1 away, merge 1 + max(collect_1, collect_2) = 1 + 2
    "plan": {"plan": 0, "w1": 1, "w2": 1, "merge": 3},
    # both workers running (they start together): merge waits for collect_* (1 each) -> 2
    "w1": {"plan": INF, "w1": 0, "w2": 0, "merge": 2},
    "w2": {"plan": INF, "w1": 0, "w2": 0, "merge": 2},
    "merge": {"plan": INF, "w1": INF, "w2": INF, "merge": 0},
}


def by_workflow(hints) -> dict[str, list[tuple[str, dict]]]:
    """Wire hints (dicts) grouped per workflow id, as (agent, steps) in arrival order."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for hint in hints:
        out.setdefault(hint["workflow_id"], []).append((hint["agent"], hint["steps"]))
    return out
