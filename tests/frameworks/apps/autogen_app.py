"""A writer and a critic taking turns in an AutoGen AgentChat round-robin group chat; the critic has a
tool (and reflects on its result, AutoGen's default second call). Written as AutoGen's docs show it,
pointed at an OpenAI-compatible server.

    python autogen_app.py --base-url http://127.0.0.1:8000/v1 [--sessions N]

The chat ends at ``MaxMessageTermination`` (the framework's own turn limit). ``max_tokens=24`` is
what tripped the server before: a small budget with tools must truncate, not fail.
"""

from __future__ import annotations

import asyncio
import json

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

from app_args import app_parser, served_model


def word_count(text: str) -> int:
    """How many words a text has."""
    return len(text.split())


def build(base_url: str, model: str) -> RoundRobinGroupChat:
    client = OpenAIChatCompletionClient(
        model=model, base_url=base_url, api_key="unused", max_tokens=24, temperature=0.7,
        model_info=ModelInfo(vision=False, function_calling=True, json_output=True, family="unknown",
                             structured_output=True),
    )
    writer = AssistantAgent("writer", model_client=client,
                            system_message="You write one short sentence about the topic you are given.")
    critic = AssistantAgent("critic", model_client=client, tools=[word_count], reflect_on_tool_use=True,
                            system_message="You check the writer's sentence: count its words with the tool, "
                                           "then say whether it is short enough.")
    return RoundRobinGroupChat([writer, critic], termination_condition=MaxMessageTermination(5))


async def main() -> None:
    parser = app_parser(__doc__)
    args = parser.parse_args()
    model = served_model(args)
    outcomes = []
    for i in range(args.sessions):
        result = await build(args.base_url, model).run(task=f"Topic {i}: caching for agents.")
        outcomes.append({"messages": len(result.messages), "stop": result.stop_reason})
    print(json.dumps({"app": "autogen", "outcomes": outcomes}))


if __name__ == "__main__":
    asyncio.run(main())
