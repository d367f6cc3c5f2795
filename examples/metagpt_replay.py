"""The MetaGPT-style cyclic workflow under ``lru`` and ``kvflow`` on the embedded engine, side by side.

    python examples/metagpt_replay.py                          # the demo's backlog, SmolLM2-135M, ~3-5 minutes
    python examples/metagpt_replay.py --model tiny-random      # seconds; pools scaled for its byte tokens
    python examples/metagpt_replay.py --workflow metagpt       # one project with a host tier
    python examples/metagpt_replay.py --workflow peer          # the 4-agent PEER cycle instead

The default (``--workflow backlog``) is ``kvflow demo``'s workload repeated: the company works
through three projects, with no host tier and a device pool of 90% of the five role prompts, so
whatever is evicted is recomputed. LRU then drops the role that ran longest ago, which is the next
to come back; kvflow drops the role with the most steps to go.

The device pool is deliberately too small for every agent's fixed prompt, so the policies may differ
in what they keep: LRU keeps what ran last, KVFlow keeps (and prefetches from the host tier) what
runs next according to the steps-to-execution each call carries. Both runs are greedy, so their
outputs must be identical; the script checks it.

Each policy runs ``--repeats`` times (default 3, alternating lru and kvflow so that a change in the
machine's load hits both): cache counters are deterministic and shown once (the script checks that
the repeats agree), wall times as the median with the min-max spread. One run's time on a shared
CPU is noise (ratios of 1.48x, 1.25x and 0.97x were seen for three runs with identical counters).

What to expect from one project (``--workflow metagpt``): MetaGPT's fix loop alternates two
agents, and for a two-agent cycle "least recently used" already is "needed furthest in the future",
so the cache counters of the two policies coincide (only the one-shot agents of the first pass are
evicted, by both). On a longer cycle (``--workflow
peer``: four agents, a pool for about three of them) LRU evicts exactly the agent that runs next and
KVFlow does not: compare the device-hit and recomputed counters.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from backends.local import EngineConfig
from kvflow_orch.harness.console import print_table
from kvflow_orch.harness.demo import (DEMO_IDEA, DEMO_IDEAS, STAT_KEYS, backlog, device_tokens_for, role_prompt_tokens,
                                    run_on_engine)
from workflows.metagpt import metagpt
from workflows.peer import peer

# Device pools (tokens) too small for every agent's fixed prompt at once.
DEFAULT_DEVICE_TOKENS = {
    ("metagpt", "smollm2-135m"): 1536,
    ("metagpt", "tiny-random"): 6144,
    ("peer", "smollm2-135m"): 600,
    ("peer", "tiny-random"): 2200,
}


def build(name: str, rounds: int, max_tokens: int):
    if name == "backlog":
        plan = backlog(DEMO_IDEAS, rounds, max_tokens)
        return plan.workflow, plan.inputs
    if name == "peer":
        question = "Is a 5% dividend yield sustainable for a utility with rising debt?"
        return peer(rounds + 1, max_tokens), {"question": question}
    return metagpt(rounds, max_tokens), {"idea": DEMO_IDEA}


async def compare(name: str, model: str, device_tokens: int, host_tokens: int, rounds: int, max_tokens: int,
                  repeats: int = 3) -> None:
    outcomes: dict[str, list] = {"lru": [], "kvflow": []}
    for i in range(repeats):
        for policy in outcomes:
            # lru is the stock baseline (HiCache-style: load at admission, no workflow-aware prefetch).
            config = EngineConfig.build(model=model, device_tokens=device_tokens, host_tokens=host_tokens,
                                        policy=policy, prefetch=policy == "kvflow")
            print(f"running {name} under {policy} ({i + 1}/{repeats}) ...", flush=True)
            workflow, inputs = build(name, rounds, max_tokens)
            outcomes[policy].append(await run_on_engine(workflow, inputs, config))
    rows = []
    for key in STAT_KEYS:
        values = {p: [run.stats.get(key, "n/a") for run in runs] for p, runs in outcomes.items()}
        rows.append([key, *(_counter(v) for v in values.values()), ""])
    times = {p: [run.seconds for run in runs] for p, runs in outcomes.items()}
    medians = {p: statistics.median(t) for p, t in times.items()}
    rows.append(["workflow time (s), median [min-max]", *(_spread(t) for t in times.values()),
                 f"{medians['lru'] / medians['kvflow']:.2f}x"])
    print_table(
        f"{name} on {model}: device pool {device_tokens} tokens, host pool {host_tokens}, {repeats} runs per policy "
        "(ratio = median lru time / median kvflow time)",
        ("", "lru", "kvflow", "ratio"),
        rows,
    )
    states = [run.result.state for runs in outcomes.values() for run in runs]
    print(f"greedy outputs identical under both policies: {'yes' if all(s == states[0] for s in states) else 'NO'}")


def _counter(values: list) -> str:
    """One value when every repeat agrees (the counters are deterministic), else the median and range."""
    if all(v == values[0] for v in values):
        return str(values[0])
    return f"{statistics.median(values)} [{min(values)}-{max(values)}] (repeats differ)"


def _spread(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.2f} [{min(seconds):.2f}-{max(seconds):.2f}]"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", choices=("backlog", "metagpt", "peer"), default="backlog")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device-tokens", type=int, default=None)
    parser.add_argument("--host-tokens", type=int, default=None, help="host pool (default 0 for backlog, else 32768)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="metagpt fix rounds per project / extra peer review rounds "
                             "(default 1 for backlog, else 2)")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply cap (default 8 for backlog, else 16)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy; times are their median (default 3)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    demo = args.workflow == "backlog"
    host = args.host_tokens if args.host_tokens is not None else 0 if demo else 32768
    rounds = args.rounds if args.rounds is not None else 1 if demo else 2
    max_tokens = args.max_tokens if args.max_tokens is not None else 8 if demo else 16
    if demo:
        device = args.device_tokens or device_tokens_for(role_prompt_tokens(build("backlog", rounds, 1)[0], args.model))
    else:
        device = args.device_tokens or DEFAULT_DEVICE_TOKENS.get((args.workflow, args.model), 2048)
    asyncio.run(compare(args.workflow, args.model, device, host, rounds, max_tokens, args.repeats))
