"""``examples/langgraph_app.py`` (a LangGraph app made workflow-aware with ``instrument()``: declared
hints) run by several users at once.

    PYTHONPATH=. .venv/bin/python benchmarks/traffic_apps/instrumented_langgraph_traffic.py \\
        --base-url http://127.0.0.1:8000/v1 [--sessions N] [--max-tokens 32]

The example's graph as it is (a planner, a researcher and an outliner in parallel, a writer that
waits for both, a reviewer that sends the draft back once) and its two kvflow lines; the only
addition is the truth headers: the example's model is wrapped so that each call adds them
(``extra_headers``), the agent read from the call's system prompt, the session from the run (a
context variable, which LangGraph carries into its nodes). Steps updates go to the server through
``--base-url`` too, so a recording proxy sees them. Runs in the main venv (it imports ``kvflow_orch``).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from pathlib import Path
from typing import Any

from shared import parser, report, run_sessions, served_model, truth
from langchain_openai import ChatOpenAI

from kvflow_orch.langgraph import async_http_client, handler_of, http_client, instrument

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from langgraph_app import ROLES, build

SESSION: contextvars.ContextVar[str] = contextvars.ContextVar("session")
AGENT_OF = {prompt: role for role, prompt in ROLES.items()}


class TruthModel:
    """The example's ``ChatOpenAI``, each call naming its agent and session in the truth headers."""

    def __init__(self, llm: ChatOpenAI) -> None:
        self.llm = llm

    def invoke(self, messages: list[Any], **kwargs: Any) -> Any:
        headers = truth(AGENT_OF[messages[0].content], SESSION.get())
        return self.llm.invoke(messages, extra_headers=headers, **kwargs)


async def main() -> None:
    args = parser(__doc__).parse_args()
    model = served_model(args)
    llm = ChatOpenAI(model=model, base_url=args.base_url, api_key="unused", max_tokens=args.max_tokens,
                     temperature=0, max_retries=0, http_client=http_client(), http_async_client=async_http_client())
    app = instrument(build(TruthModel(llm)), namespace="article-writer", backend_url=args.base_url)

    async def session(i: int) -> int:
        SESSION.set(f"s{i}")  # this session's task only (asyncio.gather runs each in a copy of the context)
        state = await asyncio.to_thread(app.invoke, {"topic": f"KV caches for agents, part {i}"})
        return state["reviews"]

    outcomes = await run_sessions(args.sessions, session)
    handler_of(app).backend.flush()  # the last steps updates reach the server before the app exits
    report("instrumented_langgraph", outcomes)


if __name__ == "__main__":
    asyncio.run(main())
