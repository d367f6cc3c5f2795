"""A supervisor that routes to a weather worker and a math worker (``create_react_agent`` graphs with
tools), written for langgraph-supervisor as its README shows it, pointed at an OpenAI-compatible
server through langchain-openai's ``ChatOpenAI``.

    python langgraph_supervisor_app.py --base-url http://127.0.0.1:8000/v1 [--sessions N]

A run ends when the supervisor answers, or at LangGraph's ``recursion_limit`` (the framework's own
limit).
"""

from __future__ import annotations

import json
import warnings

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph_supervisor import create_supervisor

from app_args import app_parser, served_model

with warnings.catch_warnings():  # create_react_agent moved in LangGraph 1.x; langgraph-supervisor still uses it
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def build(base_url: str, model_name: str):
    model = ChatOpenAI(model=model_name, base_url=base_url, api_key="unused", max_tokens=96, temperature=0.7,
                       max_retries=0)
    weather = create_react_agent(model, tools=[get_weather], name="weather_expert",
                                 prompt="You answer weather questions with the get_weather tool.")
    math = create_react_agent(model, tools=[add], name="math_expert", prompt="You do arithmetic with the add tool.")
    supervisor = create_supervisor([weather, math], model=model,
                                   prompt="You manage a weather expert and a math expert. Send each question to one.")
    return supervisor.compile()


def main() -> None:
    parser = app_parser(__doc__)
    args = parser.parse_args()
    model_name = served_model(args)
    app = build(args.base_url, model_name)
    outcomes = []
    for i in range(args.sessions):
        try:
            state = app.invoke({"messages": [{"role": "user", "content": f"What is {i} plus 2, and is it sunny?"}]},
                               {"recursion_limit": 6})
            outcomes.append(len(state["messages"]))
        except GraphRecursionError:
            outcomes.append("stopped at recursion_limit")
    print(json.dumps({"app": "langgraph_supervisor", "outcomes": outcomes}))


if __name__ == "__main__":
    main()
