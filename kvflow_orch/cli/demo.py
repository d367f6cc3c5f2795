"""``kvflow demo``: the MetaGPT-style workflow on the embedded engine with SmolLM2, on this machine.

Shows every node as it starts and finishes, then a per-agent table: the agent's steps-to-execution
in every hint the run sent, prompt tokens, tokens served from cache vs recomputed, and time; then
the engine's cache counters. The default pool sizes are deliberately small (the five fixed prompts
do not all fit on the device tier) so that eviction and prefetching have work to do, and the reply
length is capped so the demo takes a minute or two on a laptop CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, Callable, NamedTuple

from backends.kvcache import policy_names

from .startup import STARTUP_ERRORS

__all__ = ["add_arguments", "main", "EngineRun", "run_on_engine", "DEMO_IDEA"]

DEMO_IDEA = "a command-line todo list that stores tasks in a local JSON file, with due dates and tags"

STAT_KEYS = (
    "device_hit_tokens",
    "host_hit_tokens",
    "prefetch_hit_tokens",
    "recomputed_tokens",
    "prefetched_tokens",
    "evicted_device_tokens",
)


class EngineRun(NamedTuple):
    result: Any
    """The :class:`~kvflow_orch.runtime.RunResult`."""
    stats: dict[str, Any]
    """``engine.stats()`` after the run."""
    seconds: float
    """Wall time of the workflow alone (engine start-up excluded)."""


async def run_on_engine(workflow: Any, inputs: dict[str, Any], config: Any, *, on_event: Callable | None = None) -> EngineRun:
    """Start an embedded engine from ``config``, run ``workflow`` on it once, stop the engine."""
    from backends.local import Engine

    from ..runtime import arun

    engine = Engine(config)
    await engine.start()
    try:
        started = time.perf_counter()
        result = await arun(workflow, inputs, backend=engine, on_event=on_event)
        seconds = time.perf_counter() - started
        return EngineRun(result, dict(engine.stats()), seconds)
    finally:
        await engine.shutdown()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), tiny-random or a HF directory")
    parser.add_argument("--idea", default=DEMO_IDEA, help="what the software company should build")
    parser.add_argument("--fix-rounds", type=int, default=2, help="Engineer <-> QA fix rounds (default 2)")
    parser.add_argument("--max-tokens", type=int, default=32, help="reply cap per call (default 32)")
    parser.add_argument("--device-tokens", type=int, default=3072, help="device KV pool in tokens (default 3072)")
    parser.add_argument("--host-tokens", type=int, default=16384, help="host KV pool in tokens (default 16384)")
    parser.add_argument("--policy", choices=policy_names(online=True), default="kvflow")
    parser.add_argument("--no-prefetch", action="store_true")
    parser.add_argument("--plain", action="store_true", help="plain text output even on a terminal")


def main(args: argparse.Namespace) -> int:
    from backends.local import EngineConfig
    from workflows.metagpt import metagpt

    from .report import AGENT_COLUMNS, ProgressPrinter, agent_rows, print_table, summarize_agents

    try:
        config = EngineConfig.build(
            model=args.model,
            device_tokens=args.device_tokens,
            host_tokens=args.host_tokens,
            policy=args.policy,
            prefetch=not args.no_prefetch,
        )
        workflow = metagpt(fix_rounds=args.fix_rounds, max_tokens=args.max_tokens)
    except ValueError as exc:
        print(f"kvflow demo: {exc}", file=sys.stderr)
        return 2
    fancy = False if args.plain else None
    print(
        f"kvflow demo: MetaGPT-style workflow (5 agents, {args.fix_rounds} fix rounds) on the embedded engine: "
        f"model {args.model}, policy {args.policy}{'' if config.cache.prefetch else ' without prefetch'}, "
        f"device pool {args.device_tokens} tokens, host pool {args.host_tokens} tokens",
        flush=True,
    )
    progress = ProgressPrinter(sys.stdout, fancy=fancy)
    from ..errors import WorkflowError

    try:
        outcome = asyncio.run(run_on_engine(workflow, {"idea": args.idea}, config, on_event=progress))
    except WorkflowError as exc:
        print(f"kvflow demo: {exc}", file=sys.stderr)
        return 1
    except STARTUP_ERRORS as exc:  # the model or the pools could not be loaded: one line, no traceback
        print(f"kvflow demo: cannot start the engine: {exc}", file=sys.stderr)
        return 2
    print()
    print_table("Per agent (steps sent = the agent's steps-to-execution in each hint, '-' = never again)",
                AGENT_COLUMNS, agent_rows(summarize_agents(outcome.result)), sys.stdout, fancy=fancy)
    print()
    stats = outcome.stats
    print_table("Engine cache counters (tokens)", ("counter", "value"),
                [[key, str(stats.get(key, "n/a"))] for key in STAT_KEYS], sys.stdout, fancy=fancy)
    print(f"\nworkflow time {outcome.seconds:.1f} s, {len(outcome.result.calls)} LLM calls")
    return 0
