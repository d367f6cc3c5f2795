"""langgraph-supervisor: a supervisor routes to a weather expert and a math expert (ReAct agents
with tools), several users at once, through langchain-openai's ``ChatOpenAI``.

    python langgraph_supervisor_traffic.py --base-url http://127.0.0.1:8000/v1 [--sessions N] [--max-tokens 32]

Each agent of each session has its own ``ChatOpenAI`` carrying the truth headers. A run ends when
the supervisor answers, or at LangGraph's ``recursion_limit``.
"""

from __future__ import annotations

import asyncio
import warnings

from shared import parser, report, run_sessions, served_model, truth
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph_supervisor import create_supervisor
from langgraph_supervisor_app import add, get_weather  # tests/frameworks/apps' tools (on the path via shared)

with warnings.catch_warnings():  # create_react_agent moved in LangGraph 1.x; langgraph-supervisor still uses it
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


def build(base_url: str, model_name: str, session: str, max_tokens: int):
    def llm(agent: str) -> ChatOpenAI:
        return ChatOpenAI(model=model_name, base_url=base_url, api_key="unused", max_tokens=max_tokens,
                          temperature=0, max_retries=0, default_headers=truth(agent, session))

    weather = create_react_agent(llm("weather_expert"), tools=[get_weather], name="weather_expert",
                                 prompt="You answer weather questions with the get_weather tool.")
    math = create_react_agent(llm("math_expert"), tools=[add], name="math_expert",
                              prompt="You do arithmetic with the add tool.")
    supervisor = create_supervisor([weather, math], model=llm("supervisor"),
                                   prompt="You manage a weather expert and a math expert. Send each question to one.")
    return supervisor.compile()


async def main() -> None:
    args = parser(__doc__).parse_args()
    model = served_model(args)

    async def session(i: int):
        app = build(args.base_url, model, f"s{i}", args.max_tokens)
        try:
            question = {"role": "user", "content": f"What is {i} plus 2, and is it sunny?"}
            state = await app.ainvoke({"messages": [question]}, {"recursion_limit": 8})
            return len(state["messages"])
        except GraphRecursionError:
            return "stopped at recursion_limit"

    report("langgraph_supervisor", await run_sessions(args.sessions, session))


if __name__ == "__main__":
    asyncio.run(main())
