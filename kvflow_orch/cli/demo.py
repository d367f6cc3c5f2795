"""``kvflow demo``: the MetaGPT-style workflow on the embedded engine with SmolLM2, on this machine,
twice on the same engine configuration: first the baseline (``--policy lru --no-prefetch``), then
kvflow (``--policy`` / ``--no-prefetch`` choose it; default kvflow with prefetch).

Shows every node as it starts and finishes, then a per-agent table of the kvflow run (the agent's
steps-to-execution in every hint it sent, prompt tokens, tokens served from cache vs recomputed,
time), then both runs side by side: prompt tokens recomputed, device / host / prefetch hits, wall
time, and whether the greedy outputs agree. The default device pool is deliberately small (the five
fixed prompts do not all fit) so that eviction and prefetching have work to do: the baseline reloads
evicted prefixes from the host tier when a request is admitted, on its critical path; kvflow has
them prefetched before the agent runs. Replies are capped so both runs take about a minute on two
CPU cores. ``--no-baseline`` runs kvflow alone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from backends.kvcache import policy_names

from ..harness.demo import BASELINE, DEMO_IDEA, EngineRun, compare_rows, run_on_engine
from .startup import STARTUP_ERRORS

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), tiny-random or a HF directory")
    parser.add_argument("--idea", default=DEMO_IDEA, help="what the software company should build")
    parser.add_argument("--fix-rounds", type=int, default=2, help="Engineer <-> QA fix rounds (default 2)")
    parser.add_argument("--max-tokens", type=int, default=16, help="reply cap per call (default 16)")
    parser.add_argument("--device-tokens", type=int, default=1536, help="device KV pool in tokens (default 1536)")
    parser.add_argument("--host-tokens", type=int, default=16384, help="host KV pool in tokens (default 16384)")
    parser.add_argument("--policy", choices=policy_names(online=True), default="kvflow")
    parser.add_argument("--no-prefetch", action="store_true")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the baseline run (--policy lru --no-prefetch) and its side-by-side table")
    parser.add_argument("--plain", action="store_true", help="plain text output even on a terminal")


def main(args: argparse.Namespace) -> int:
    from backends.local import EngineConfig
    from workflows.metagpt import metagpt

    from ..harness.console import AGENT_COLUMNS, ProgressPrinter, agent_rows, print_table, summarize_agents

    chosen = (args.policy, not args.no_prefetch)
    plans = ([("baseline", BASELINE)] if not args.no_baseline else []) + [("kvflow", chosen)]
    try:
        configs = {
            name: EngineConfig.build(model=args.model, device_tokens=args.device_tokens, host_tokens=args.host_tokens,
                                     policy=policy, prefetch=prefetch)
            for name, (policy, prefetch) in plans
        }
        workflow = metagpt(fix_rounds=args.fix_rounds, max_tokens=args.max_tokens)
    except ValueError as exc:
        print(f"kvflow demo: {exc}", file=sys.stderr)
        return 2
    fancy = False if args.plain else None
    labels = {name: f"{config.cache.policy}, {'prefetch' if config.cache.prefetch else 'no prefetch'}"
              for name, config in configs.items()}
    print(
        f"kvflow demo: MetaGPT-style workflow (5 agents, {args.fix_rounds} fix rounds) on the embedded engine: "
        f"model {args.model}, device pool {args.device_tokens} tokens, host pool {args.host_tokens} tokens; "
        + " then ".join(f"{name} ({labels[name]})" for name in configs),
        flush=True,
    )
    from ..errors import WorkflowError

    runs: dict[str, EngineRun] = {}
    for name, config in configs.items():
        print(f"\n{name} run: policy {labels[name]}", flush=True)
        progress = ProgressPrinter(sys.stdout, fancy=fancy)
        try:
            runs[name] = asyncio.run(run_on_engine(workflow, {"idea": args.idea}, config, on_event=progress))
        except WorkflowError as exc:
            print(f"kvflow demo: {exc}", file=sys.stderr)
            return 1
        except STARTUP_ERRORS as exc:  # the model or the pools could not be loaded: one line, no traceback
            print(f"kvflow demo: cannot start the engine: {exc}", file=sys.stderr)
            return 2
    outcome = runs["kvflow"]
    print()
    print_table("Per agent, kvflow run (steps sent = the agent's steps-to-execution in each hint, '-' = never again)",
                AGENT_COLUMNS, agent_rows(summarize_agents(outcome.result)), sys.stdout, fancy=fancy)
    print()
    print_table("Engine cache counters (tokens), side by side", ("", *(f"{n} ({labels[n]})" for n in runs)),
                compare_rows(runs), sys.stdout, fancy=fancy)
    if "baseline" in runs:
        same = runs["baseline"].result.state == outcome.result.state
        print(f"greedy outputs identical in both runs: {'yes' if same else 'NO'}")
        print("The counters are exact; one wall time on a shared CPU is not (load from other processes, the first "
              "run's warm-up): examples/metagpt_replay.py reports medians of repeats.")
    print(f"\nworkflow time {outcome.seconds:.1f} s, {len(outcome.result.calls)} LLM calls")
    return 0
