"""A manager agent that delegates to a managed weather agent with a tool, written for smolagents
(``ToolCallingAgent``) as its docs show multi-agent setups, pointed at an OpenAI-compatible server.

    python smolagents_app.py --base-url http://127.0.0.1:8000/v1 [--sessions N]

Each run ends with a ``final_answer`` call or at ``max_steps`` (the framework's own limit, after
which it writes a final answer itself).
"""

from __future__ import annotations

import json

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from app_args import app_parser, served_model


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city to look up.
    """
    return f"Sunny in {city}."


def build(base_url: str, model_id: str) -> ToolCallingAgent:
    model = OpenAIServerModel(model_id=model_id, api_base=base_url, api_key="unused", max_tokens=128, temperature=0.7)
    weather = ToolCallingAgent(tools=[get_weather], model=model, max_steps=2, name="weather_agent",
                               description="Answers weather questions.", verbosity_level=0)
    return ToolCallingAgent(tools=[], model=model, managed_agents=[weather], max_steps=2, verbosity_level=0)


def main() -> None:
    parser = app_parser(__doc__)
    args = parser.parse_args()
    model_id = served_model(args)
    manager = build(args.base_url, model_id)
    outcomes = []
    for i in range(args.sessions):
        answer = manager.run(f"What is the weather in city number {i}?")
        outcomes.append(str(answer)[:40])
    print(json.dumps({"app": "smolagents", "outcomes": outcomes}))


if __name__ == "__main__":
    main()
