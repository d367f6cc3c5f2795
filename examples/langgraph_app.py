"""An ordinary LangGraph app, made workflow-aware with two added lines (marked ``# kvflow``).

Start a kvflow server, then run the app against it:

    kvflow serve --model smollm2-135m            # http://127.0.0.1:30000
    python examples/langgraph_app.py --topic "KV caches" [--url http://127.0.0.1:30000]

Every ChatOpenAI call made inside a node then carries the steps-to-execution of all five agents,
so the server keeps (and prefetches) the KV cache of the agents that run next. Without the two
lines the app runs the same, just without hints.
"""

from __future__ import annotations

import argparse
import operator
from typing import Annotated, Literal, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from kvflow_orch.langgraph import async_http_client, http_client, instrument


class Article(TypedDict, total=False):
    topic: str
    plan: str
    notes: Annotated[list[str], operator.add]
    draft: str
    reviews: int


ROLES = {
    "planner": "You are an editor-in-chief. Break a topic into three short sections.",
    "researcher": "You are a researcher. List key facts for the plan you are given.",
    "outliner": "You are a structure editor. Turn a plan into a bullet outline.",
    "writer": "You are a technical writer. Write a short article from the notes.",
    "reviewer": "You are a strict reviewer. Answer APPROVE or list fixes.",
}


def build(llm: ChatOpenAI, max_reviews: int = 1):
    def ask(role: str, text: str) -> str:
        return llm.invoke([SystemMessage(ROLES[role]), HumanMessage(text)]).content

    def planner(s: Article) -> dict:
        return {"plan": ask("planner", s["topic"])}

    def researcher(s: Article) -> dict:
        return {"notes": [ask("researcher", s["plan"])]}

    def outliner(s: Article) -> dict:
        return {"notes": [ask("outliner", s["plan"])]}

    def writer(s: Article) -> dict:
        return {"draft": ask("writer", "\n".join(s["notes"]))}

    def reviewer(s: Article) -> dict:
        ask("reviewer", s["draft"])
        return {"reviews": s.get("reviews", 0) + 1}

    def after_review(s: Article) -> Literal["writer", "__end__"]:
        return "writer" if s["reviews"] <= max_reviews else END

    g = StateGraph(Article)
    for name, fn in [("planner", planner), ("researcher", researcher), ("outliner", outliner),
                     ("writer", writer), ("reviewer", reviewer)]:
        g.add_node(name, fn)
    g.add_edge(START, "planner")
    g.add_edge("planner", "researcher")
    g.add_edge("planner", "outliner")
    g.add_edge(["researcher", "outliner"], "writer")  # waits for both
    g.add_edge("writer", "reviewer")
    g.add_conditional_edges("reviewer", after_review)
    return g.compile()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="kvflow server (kvflow serve)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--topic", default="why multi-agent workflows need workflow-aware KV caching")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    llm = ChatOpenAI(
        model=args.model,
        base_url=args.url + "/v1",
        api_key="unused",
        max_tokens=args.max_tokens,
        temperature=0,
        http_client=http_client(), http_async_client=async_http_client(),  # kvflow (1/2)
    )
    app = build(llm)
    app = instrument(app, namespace="article-writer", backend_url=args.url)  # kvflow (2/2)

    result = app.invoke({"topic": args.topic})
    print(f"plan:\n{result['plan']}\n\ndraft after {result['reviews']} review(s):\n{result['draft']}")


if __name__ == "__main__":
    main()
