"""A planner agent that delegates research to a second agent through a tool and answers with a
structured (nested pydantic) result, written for pydantic-ai as its docs show agent delegation,
pointed at an OpenAI-compatible server.

    python pydantic_ai_app.py --base-url http://127.0.0.1:8000/v1 [--sessions N]

The structured result arrives as pydantic-ai's ``final_result`` tool call, whose schema has
``$defs`` (the nested model). A run that reaches its ``UsageLimits`` has stopped at the framework's
own limit.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, Field
from pydantic_ai import Agent, RunContext, UsageLimitExceeded, UsageLimits
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from app_args import app_parser, served_model


class Place(BaseModel):
    city: str = Field(max_length=20)
    days: int


class Trip(BaseModel):
    place: Place
    summary: str = Field(max_length=60)


def build(base_url: str, model_name: str) -> Agent[None, Trip]:
    model = OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    settings = {"max_tokens": 96, "temperature": 0.7}
    researcher = Agent(model, instructions="You suggest one city worth visiting, in a few words.",
                       model_settings=settings)
    planner = Agent(model, output_type=Trip, model_settings=settings,
                    instructions="You plan trips. Ask the research tool for a city, then give the trip.")

    @planner.tool
    async def research(ctx: RunContext[None], question: str) -> str:
        """Ask the researcher a question."""
        answer = await researcher.run(question, usage=ctx.usage, usage_limits=UsageLimits(request_limit=6))
        return answer.output

    return planner


def main() -> None:
    parser = app_parser(__doc__)
    args = parser.parse_args()
    model_name = served_model(args)
    planner = build(args.base_url, model_name)
    outcomes = []
    for i in range(args.sessions):
        try:
            trip = planner.run_sync(f"Plan trip number {i}.", usage_limits=UsageLimits(request_limit=6)).output
            outcomes.append({"city": trip.place.city, "days": trip.place.days})
        except UsageLimitExceeded:
            outcomes.append("stopped at the request limit")
    print(json.dumps({"app": "pydantic_ai", "outcomes": outcomes}))


if __name__ == "__main__":
    main()
