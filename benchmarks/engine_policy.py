"""Eviction policy and prefetch on the real embedded engine.

The paper's synthetic sequential workflow: ``--agents`` agents in a ring, each with its own fixed
prompt (``--fixed`` tokens) plus a fresh dynamic part (``--dynamic``) and ``--output`` generated
tokens, for ``--rounds`` rounds. Every request carries the KVFlow hint (steps of agent j while agent i
runs: (j - i) mod N). The device pool holds about half the fixed prompts (plus room for the request
being served); the host tier holds everything (``--host-tokens 0``: no host tier, evicted KV is
dropped). Configurations run one after the other in this process: lru, kvflow without prefetch,
kvflow with prefetch (prefetch needs a host tier). Round 0 is a cold start, the same for every
configuration; "steady" times rounds 1+.

On a CPU "device" and "host" are both main memory, so a host reload is a memcpy: with a host tier
the three configurations take the same time here (the counters still show kvflow keeping the next
agents on device and prefetch removing the admission stall). With ``--host-tokens 0`` (evicted KV is
dropped, as on a GPU without a host tier) the policies differ in what they must recompute, and the
end-to-end ratio shows it.

Takes about 3 minutes on 2 idle cores with SmolLM2 (7 on a busy shared machine); ``--model tiny-random``
runs in seconds.

    python benchmarks/engine_policy.py [--model smollm2-135m] [--agents 6] [--fixed 512] [--dynamic 32]
        [--output 32] [--rounds 3] [--host-tokens N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_workload import describe_machine, random_tokens, run_sequential, sampling

from backends.base import GenerateRequest
from backends.local import Engine, EngineConfig
from kvflow_orch.protocol import KVFlowHint

COUNTERS = ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens", "recomputed_tokens",
            "prefetched_tokens", "prefetch_unused_tokens", "evicted_device_tokens")


def workflow_requests(engine: Engine, args: argparse.Namespace) -> list[list[GenerateRequest]]:
    """``rounds`` lists of one request per agent, in ring order."""
    names = [f"agent{i}" for i in range(args.agents)]
    fixed = [random_tokens(engine, args.fixed, seed=i) for i in range(args.agents)]
    rounds = []
    for r in range(args.rounds):
        batch = []
        for i, name in enumerate(names):
            steps = {other: (j - i) % args.agents for j, other in enumerate(names)}
            hint = KVFlowHint(workflow_id="ring", agent=name, steps=steps)
            dynamic = random_tokens(engine, args.dynamic, seed=100_000 + r * 1000 + i)
            batch.append(GenerateRequest(fixed[i] + dynamic, sampling(args.output), hint=hint,
                                         fixed_prefix_tokens=args.fixed))
        rounds.append(batch)
    return rounds


def run_config(args: argparse.Namespace, policy: str, prefetch: bool, device_tokens: int, host_tokens: int) -> dict:
    engine = Engine(EngineConfig.build(model=args.model, device_tokens=device_tokens, host_tokens=host_tokens,
                                 policy=policy, prefetch=prefetch, dtype=args.dtype))
    times = []
    for batch in workflow_requests(engine, args):
        start = time.perf_counter()
        run_sequential(engine, batch)
        times.append(time.perf_counter() - start)
    stats = engine.stats()
    engine.close()
    return {"times": times, "stats": stats}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--fixed", type=int, default=512)
    parser.add_argument("--dynamic", type=int, default=32)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--host-tokens", type=int, default=None, help="default: room for every prompt")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 0 is the cold start)")

    per_request = args.fixed + args.dynamic + args.output
    device_tokens = args.agents * args.fixed // 2 + per_request
    host_tokens = args.host_tokens if args.host_tokens is not None else 2 * args.agents * per_request * args.rounds
    configs = [("lru", False), ("kvflow", False)] + ([("kvflow", True)] if host_tokens else [])
    print(describe_machine())
    print(f"model {args.model}: {args.agents} agents, fixed {args.fixed}, dynamic {args.dynamic}, "
          f"output {args.output}, "
          f"{args.rounds} rounds; device pool {device_tokens} tokens (half the fixed prompts + one request), "
          f"host {host_tokens}")
    results = {}
    for policy, prefetch in configs:
        name = f"{policy}{' + prefetch' if prefetch else ''}"
        results[name] = run_config(args, policy, prefetch, device_tokens, host_tokens)
        times = results[name]["times"]
        print(f"  {name:18s} round times " + ", ".join(f"{t:.1f}s" for t in times), flush=True)
    base = sum(results["lru"]["times"][1:])
    print(f"\n{'config':18s} {'total s':>8s} {'steady s':>9s} {'lru/this':>9s}  "
          + "  ".join(f"{c[:-7]:>15s}" for c in COUNTERS))
    for name, res in results.items():
        steady = sum(res["times"][1:])
        print(f"{name:18s} {sum(res['times']):8.1f} {steady:9.1f} {base / steady:8.2f}x  "
              + "  ".join(f"{res['stats'][c]:>15d}" for c in COUNTERS))
    print(describe_machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
