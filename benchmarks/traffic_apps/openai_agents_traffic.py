"""OpenAI Agents SDK: a triage agent hands weather questions off to a weather agent with a function
tool, several users at once (Chat Completions API: the route the learner reads).

    python openai_agents_traffic.py --base-url http://127.0.0.1:8000/v1 [--sessions N] [--max-tokens 32]

Each agent of each session has its own ``AsyncOpenAI`` client carrying the truth headers
(``shared.truth``). The triage agent must call a tool (the handoff); the weather agent must call
``get_weather`` first (the SDK then resets ``tool_choice`` and lets it answer). A run stops at
``max_turns`` at the latest.
"""

from __future__ import annotations

import asyncio

from shared import parser, report, run_sessions, served_model, truth
from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI

MAX_TURNS = 4


@function_tool
def get_weather(city: str) -> str:
    """The forecast for a city.

    Args:
        city: The city.
    """
    return f"Sunny in {city}."


def build(base_url: str, model: str, session: str, max_tokens: int) -> Agent:
    def llm(agent: str) -> OpenAIChatCompletionsModel:
        client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, default_headers=truth(agent, session))
        return OpenAIChatCompletionsModel(model=model, openai_client=client)

    settings = ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=0)
    weather = Agent(name="weather", model=llm("weather"), tools=[get_weather], model_settings=settings,
                    instructions="You answer weather questions. Call get_weather, then answer in one sentence.")
    return Agent(name="triage", model=llm("triage"), handoffs=[weather], model_settings=settings,
                 instructions="You route questions. Hand every weather question to the weather agent.")


async def main() -> None:
    args = parser(__doc__).parse_args()
    set_tracing_disabled(True)
    model = served_model(args)

    async def session(i: int) -> str:
        try:
            result = await Runner.run(build(args.base_url, model, f"s{i}", args.max_tokens),
                                      f"What is the weather in city number {i}?", max_turns=MAX_TURNS)
            return f"{result.last_agent.name}: {str(result.final_output)[:40]!r}"
        except MaxTurnsExceeded:
            return "stopped at max_turns"

    report("openai_agents", await run_sessions(args.sessions, session))


if __name__ == "__main__":
    asyncio.run(main())
