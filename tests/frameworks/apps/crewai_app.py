"""A researcher and a writer crew, run sequentially and then under a manager (hierarchical), written
for CrewAI as its docs show it, pointed at an OpenAI-compatible server.

    python crewai_app.py --base-url http://127.0.0.1:8000/v1 [--sessions N] [--process sequential|hierarchical|both]

Each agent (the manager too) stops at its ``max_iter`` (the framework's own limit) if it has not
answered by then.
"""

from __future__ import annotations

import json
import os

# No network here for CrewAI's telemetry and tracing.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Process, Task

from app_args import app_parser, served_model


def build(base_url: str, model_name: str, process: Process) -> Crew:
    llm = LLM(model=f"openai/{model_name}", base_url=base_url, api_key="unused", max_tokens=96, temperature=0.7)
    researcher = Agent(role="Researcher", goal="Find one fact about the topic", llm=llm, max_iter=2, verbose=False,
                       backstory="You are a careful researcher who answers in one sentence.")
    writer = Agent(role="Writer", goal="Write one sentence from the research", llm=llm, max_iter=2, verbose=False,
                   backstory="You are a concise writer.")
    research = Task(description="Find one fact about {topic}.", expected_output="One sentence.", agent=researcher)
    write = Task(description="Write one sentence about {topic} from the research.", expected_output="One sentence.",
                 agent=writer)
    if process == Process.hierarchical:  # a custom manager (CrewAI's own has max_iter 25)
        manager = Agent(role="Manager", goal="Get the tasks done by your coworkers", llm=llm, max_iter=2,
                        allow_delegation=True, verbose=False, backstory="You delegate each task to the right coworker.")
        return Crew(agents=[researcher, writer], tasks=[research, write], process=process, manager_agent=manager,
                    verbose=False)
    return Crew(agents=[researcher, writer], tasks=[research, write], process=process, verbose=False)


def main() -> None:
    parser = app_parser(__doc__)
    parser.add_argument("--process", choices=("sequential", "hierarchical", "both"), default="both")
    args = parser.parse_args()
    model_name = served_model(args)
    processes = [Process.sequential, Process.hierarchical] if args.process == "both" else [Process(args.process)]
    outcomes = []
    for i in range(args.sessions):
        for process in processes:
            result = build(args.base_url, model_name, process).kickoff(inputs={"topic": f"caching, part {i}"})
            outcomes.append({"process": process.value, "tasks": len(result.tasks_output)})
    print(json.dumps({"app": "crewai", "outcomes": outcomes}))


if __name__ == "__main__":
    main()
