"""AutoGen AgentChat: a writer and a critic in a round-robin group chat, several users at once; the
critic counts words with a tool and reflects on its result (``reflect_on_tool_use``: a second call, with no tools).

    python autogen_traffic.py --base-url http://127.0.0.1:8000/v1 [--sessions N] [--max-tokens 32]

Each agent of each session has its own model client carrying the truth headers. A chat ends at
``MaxMessageTermination`` (the framework's own limit).
"""

from __future__ import annotations

import asyncio

from shared import parser, report, run_sessions, served_model, truth
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient


class ToolFirstClient(OpenAIChatCompletionClient):
    """A client that makes a call offering tools use one (``tool_choice="required"``): the small model
    would rarely pick a tool on its own, and the critic's tool call is what its reflection follows."""

    async def create(self, messages, *, tools=(), tool_choice="auto", **kwargs):  # type: ignore[override]
        return await super().create(messages, tools=tools, tool_choice="required" if tools else tool_choice, **kwargs)


def word_count(text: str) -> int:
    """How many words a text has."""
    return len(text.split())


def build(base_url: str, model: str, session: str, max_tokens: int) -> RoundRobinGroupChat:
    def client(agent: str) -> OpenAIChatCompletionClient:
        return ToolFirstClient(
            model=model, base_url=base_url, api_key="unused", max_tokens=max_tokens, temperature=0,
            default_headers=truth(agent, session),
            model_info=ModelInfo(vision=False, function_calling=True, json_output=True, family="unknown",
                                 structured_output=True))

    writer = AssistantAgent("writer", model_client=client("writer"),
                            system_message="You write one short sentence about the topic you are given.")
    critic = AssistantAgent("critic", model_client=client("critic"), tools=[word_count], reflect_on_tool_use=True,
                            system_message="You check the writer's sentence: count its words with the tool, "
                                           "then say whether it is short enough.")
    return RoundRobinGroupChat([writer, critic], termination_condition=MaxMessageTermination(7))


async def main() -> None:
    args = parser(__doc__).parse_args()
    model = served_model(args)

    async def session(i: int) -> dict:
        result = await build(args.base_url, model, f"s{i}", args.max_tokens).run(task=f"Topic {i}: caching for agents.")
        return {"messages": len(result.messages), "stop": result.stop_reason}

    report("autogen", await run_sessions(args.sessions, session))


if __name__ == "__main__":
    asyncio.run(main())
