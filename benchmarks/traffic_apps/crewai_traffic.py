"""CrewAI: a researcher and a writer crew, run sequentially and under a manager (hierarchical),
several users at once (each crew's ``kickoff`` in its own thread).

    python crewai_traffic.py --base-url http://127.0.0.1:8000/v1 [--sessions N] [--max-tokens 32]

Session ``i`` runs the sequential crew for even ``i``, the hierarchical one for odd ``i``. Each agent
of each session (the manager too) has its own ``LLM`` carrying the truth headers, and stops at its
``max_iter`` if it has not answered by then. The manager must use a tool when offered one (it
delegates), with room for the delegation's arguments (128 tokens).
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # no network here for telemetry and tracing
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from shared import parser, report, run_sessions, served_model, truth
from crewai import LLM, Agent, Crew, Process, Task
from crewai.llms.providers.openai.completion import OpenAICompletion


class DelegatingLLM(OpenAICompletion):
    """The manager's LLM: a call that offers tools must use one (CrewAI always asks ``"auto"``, and the
    small model would answer itself instead of delegating to a coworker)."""

    def _prepare_completion_params(self, messages, tools=None, *args, **kwargs):  # type: ignore[override]
        params = super()._prepare_completion_params(messages, tools, *args, **kwargs)
        if params.get("tools"):
            params["tool_choice"] = "required"
        return params


def build(base_url: str, model_name: str, session: str, process: Process, max_tokens: int) -> Crew:
    def llm(agent: str, kind: type = LLM, tokens: int = max_tokens) -> LLM:
        name = f"openai/{model_name}" if kind is LLM else model_name
        return kind(model=name, base_url=base_url, api_key="unused", max_tokens=tokens, temperature=0,
                    default_headers=truth(agent, session))

    researcher = Agent(role="Researcher", goal="Find one fact about the topic", llm=llm("researcher"), max_iter=2,
                       verbose=False, backstory="You are a careful researcher who answers in one sentence.")
    writer = Agent(role="Writer", goal="Write one sentence from the research", llm=llm("writer"), max_iter=2,
                   verbose=False, backstory="You are a concise writer.")
    research = Task(description="Find one fact about {topic}.", expected_output="One sentence.", agent=researcher)
    write = Task(description="Write one sentence about {topic} from the research.", expected_output="One sentence.",
                 agent=writer)
    if process == Process.hierarchical:  # a custom manager (CrewAI's own has max_iter 25)
        manager = Agent(role="Manager", goal="Get the tasks done by your coworkers",
                        llm=llm("manager", DelegatingLLM, 128), max_iter=2, allow_delegation=True, verbose=False,
                        backstory="You delegate each task to the right coworker.")
        return Crew(agents=[researcher, writer], tasks=[research, write], process=process, manager_agent=manager,
                    verbose=False)
    return Crew(agents=[researcher, writer], tasks=[research, write], process=process, verbose=False)


async def main() -> None:
    args = parser(__doc__).parse_args()
    model = served_model(args)

    async def session(i: int) -> dict:
        process = Process.sequential if i % 2 == 0 else Process.hierarchical
        crew = build(args.base_url, model, f"s{i}", process, args.max_tokens)
        result = await asyncio.to_thread(crew.kickoff, inputs={"topic": f"caching, part {i}"})
        return {"process": process.value, "tasks": len(result.tasks_output)}

    report("crewai", await run_sessions(args.sessions, session))


if __name__ == "__main__":
    asyncio.run(main())
