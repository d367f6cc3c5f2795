"""Quickstart: two agents and a plain Python step, run on the embedded engine.

    python examples/quickstart.py                      # SmolLM2-135M in this process
    python examples/quickstart.py local:tiny-random    # a tiny random model (fast, gibberish)
    python examples/quickstart.py http://127.0.0.1:8000   # any kvflow / OpenAI-compatible server

Every LLM call carries the workflow's steps-to-execution, so the backend keeps the KV of the
agent that runs next and evicts (or offloads) the one that will not run again.
"""

from __future__ import annotations

import sys

from kvflow_orch import END, START, Workflow, run

WRITER = "You are a technical writer. You explain one idea in three short, plain sentences."
CRITIC = "You are a strict editor. You reply with the single most important improvement to a text."

wf = Workflow("quickstart")
wf.add_agent("writer", system=WRITER, prompt="Explain: {topic}", output="draft", max_tokens=64)
wf.add_agent("critic", system=CRITIC, prompt="Text:\n{draft}", output="advice", max_tokens=48)
wf.add_node("count", lambda state: {"drafts": state.get("drafts", 0) + 1})  # plain Python, no LLM

wf.add_edge(START, "writer")
wf.add_edge("writer", "critic")
wf.add_edge("critic", "count")
# A conditional edge: rewrite once with the critic's advice, then stop.
wf.add_conditional_edges("count", lambda state: "again" if state["drafts"] < 2 else "done",
                         {"again": "writer", "done": END})


if __name__ == "__main__":
    backend = sys.argv[1] if len(sys.argv) > 1 else "local"
    result = run(wf, {"topic": "why caching the fixed part of a prompt saves time"}, backend=backend)
    print("final draft:", result.state["draft"])
    print("advice:     ", result.state["advice"])
    for rec in result.trace:
        print(f"  {rec.node:7} {rec.end - rec.start:6.2f}s  prompt {rec.prompt_tokens:4}  cached {rec.cached_tokens:4}")
