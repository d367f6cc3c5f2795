"""A triage agent that hands weather questions to a weather agent with a function tool, written
for the OpenAI Agents SDK as its docs show it, pointed at an OpenAI-compatible server.

    python openai_agents_app.py --base-url http://127.0.0.1:8000/v1 [--api responses|chat] [--sessions N]

The server is the SDK's default client (``set_default_openai_client``), so agents naming a model
get the SDK's default model class: ``OpenAIResponsesModel`` (the Responses API) with ``--api
responses``, ``OpenAIChatCompletionsModel`` with ``--api chat`` (``set_default_openai_api``).
Each session runs once non-streamed and once streamed; a session that reaches ``max_turns`` has
stopped at the framework's own limit and counts as done.
"""

from __future__ import annotations

import asyncio
import json

from agents import (Agent, MaxTurnsExceeded, ModelSettings, Runner, function_tool, set_default_openai_api,
                    set_default_openai_client, set_tracing_disabled)
from openai import AsyncOpenAI

from app_args import app_parser, served_model

MAX_TURNS = 3


@function_tool
def get_weather(city: str, days: int) -> str:
    """The forecast for a city.

    Args:
        city: The city.
        days: How many days ahead.
    """
    return f"Sunny in {city} for the next {days} days."


def build(model: str) -> Agent:
    weather = Agent(name="weather", model=model, tools=[get_weather],
                    instructions="You answer weather questions. Call get_weather, then answer in one sentence.",
                    model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0.7))
    return Agent(name="triage", model=model, handoffs=[weather],
                 instructions="You route questions. Hand every weather question to the weather agent.",
                 model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0.7))


async def session(triage: Agent, question: str, streamed: bool) -> str:
    try:
        if streamed:
            run = Runner.run_streamed(triage, question, max_turns=MAX_TURNS)
            async for _ in run.stream_events():
                pass
            return f"{run.last_agent.name}: {str(run.final_output)[:40]!r}"
        result = await Runner.run(triage, question, max_turns=MAX_TURNS)
        return f"{result.last_agent.name}: {str(result.final_output)[:40]!r}"
    except MaxTurnsExceeded:
        return "stopped at max_turns"


async def main() -> None:
    parser = app_parser(__doc__)
    parser.add_argument("--api", choices=("responses", "chat"), default="responses")
    args = parser.parse_args()
    set_tracing_disabled(True)  # no network for the tracing exporter
    set_default_openai_client(AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0),
                              use_for_tracing=False)
    set_default_openai_api("responses" if args.api == "responses" else "chat_completions")
    triage = build(served_model(args))
    outcomes = []
    for i in range(args.sessions):
        for streamed in (False, True):
            outcomes.append(await session(triage, f"What is the weather in city number {i}?", streamed))
    print(json.dumps({"app": "openai_agents", "api": args.api, "outcomes": outcomes}))


if __name__ == "__main__":
    asyncio.run(main())
