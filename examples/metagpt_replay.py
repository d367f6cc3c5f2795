"""The MetaGPT-style cyclic workflow under ``lru`` and ``kvflow`` on the embedded engine, side by side.

    python examples/metagpt_replay.py                          # SmolLM2-135M, ~2-4 minutes on a CPU
    python examples/metagpt_replay.py --model tiny-random      # seconds; pools scaled for its byte tokens
    python examples/metagpt_replay.py --workflow peer          # the 4-agent PEER cycle instead

The device pool is deliberately too small for every agent's fixed prompt, so the policies may differ
in what they keep: LRU keeps what ran last, KVFlow keeps (and prefetches from the host tier) what
runs next according to the steps-to-execution each call carries. Both runs are greedy, so their
outputs must be identical; the script checks it.

What to expect: MetaGPT's fix loop alternates two agents, and for a two-agent cycle "least recently
used" already is "needed furthest in the future", so the cache counters of the two policies coincide
(only the one-shot agents of the first pass are evicted, by both). On a longer cycle (``--workflow
peer``: four agents, a pool for about three of them) LRU evicts exactly the agent that runs next and
KVFlow does not: compare the device-hit and recomputed counters.
"""

from __future__ import annotations

import argparse
import asyncio

from backends.local import EngineConfig
from kvflow_orch.cli.report import print_table
from kvflow_orch.cli.demo import DEMO_IDEA, STAT_KEYS, run_on_engine
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
    if name == "peer":
        return peer(rounds + 1, max_tokens), {"question": "Is a 5% dividend yield sustainable for a utility with rising debt?"}
    return metagpt(rounds, max_tokens), {"idea": DEMO_IDEA}


async def compare(name: str, model: str, device_tokens: int, host_tokens: int, rounds: int, max_tokens: int) -> None:
    outcomes = {}
    for policy in ("lru", "kvflow"):
        # lru is the stock baseline (HiCache-style: load at admission, no workflow-aware prefetch).
        config = EngineConfig.build(model=model, device_tokens=device_tokens, host_tokens=host_tokens, policy=policy,
                              prefetch=policy == "kvflow")
        print(f"running {name} under {policy} ...", flush=True)
        workflow, inputs = build(name, rounds, max_tokens)
        outcomes[policy] = await run_on_engine(workflow, inputs, config)
    lru, kvf = outcomes["lru"], outcomes["kvflow"]
    rows = [["workflow time (s)", f"{lru.seconds:.2f}", f"{kvf.seconds:.2f}", f"{lru.seconds / kvf.seconds:.2f}x"]]
    for key in STAT_KEYS:
        rows.append([key, str(lru.stats.get(key, "n/a")), str(kvf.stats.get(key, "n/a")), ""])
    print_table(
        f"{name} on {model}: device pool {device_tokens} tokens, host pool {host_tokens} (ratio = lru time / kvflow time)",
        ("", "lru", "kvflow", "ratio"),
        rows,
    )
    same = lru.result.state == kvf.result.state
    print(f"greedy outputs identical under both policies: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", choices=("metagpt", "peer"), default="metagpt")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device-tokens", type=int, default=None)
    parser.add_argument("--host-tokens", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=2, help="metagpt fix rounds / extra peer review rounds")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    device = args.device_tokens or DEFAULT_DEVICE_TOKENS.get((args.workflow, args.model), 2048)
    asyncio.run(compare(args.workflow, args.model, device, args.host_tokens, args.rounds, args.max_tokens))
