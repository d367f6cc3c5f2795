"""Prefix reuse on the embedded engine: time to first token of a SmolLM2
request with a 1,024-token fixed prompt, cached vs recomputed, side by side in one run.

Each repetition sends a prompt whose fixed part is new (a miss: all 1,024 + dynamic tokens are
prefilled), then the same fixed part with a different dynamic part (a device hit: only the dynamic
tokens are prefilled). Target: cached >= 3x faster. Prints min and median over repetitions.

    python benchmarks/engine_prefix_reuse.py [--model smollm2-135m] [--fixed 1024] [--dynamic 32] [--reps 5] \\
        [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_workload import describe_machine, random_tokens, run_sequential, sampling

from backends.base import GenerateRequest
from backends.local import Engine, EngineConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--fixed", type=int, default=1024)
    parser.add_argument("--dynamic", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    engine = Engine(EngineConfig.build(model=args.model, device_tokens=(args.fixed + args.dynamic + 8) * 4,
                                 host_tokens=0, dtype=args.dtype, chunk_tokens=2048))
    print(describe_machine())
    print(f"model {args.model} ({args.dtype}), fixed {args.fixed} tokens, dynamic {args.dynamic}, {args.reps} reps")
    # warm-up: first-call allocations and kernel selection
    warm = random_tokens(engine, args.fixed + args.dynamic, seed=10_000)
    run_sequential(engine, [GenerateRequest(warm, sampling(1))])
    cold, hot = [], []
    for rep in range(args.reps):
        fixed = random_tokens(engine, args.fixed, seed=rep)
        miss, hit = (GenerateRequest(fixed + random_tokens(engine, args.dynamic, seed=1000 * rep + k), sampling(1))
                     for k in (1, 2))
        first, second = run_sequential(engine, [miss, hit])
        assert first.cached_tokens == 0 and second.cached_tokens == args.fixed, (first, second)
        cold.append(first.ttft_s)
        hot.append(second.ttft_s)
        print(f"  rep {rep}: recomputed {first.ttft_s * 1000:8.1f} ms   cached {second.ttft_s * 1000:8.1f} ms")
    engine.close()
    print(f"TTFT recomputed: min {min(cold) * 1000:.1f} ms, median {statistics.median(cold) * 1000:.1f} ms")
    print(f"TTFT cached:     min {min(hot) * 1000:.1f} ms, median {statistics.median(hot) * 1000:.1f} ms")
    ratio = min(cold) / min(hot)
    print(f"speed-up (min/min): {ratio:.1f}x   (median/median {statistics.median(cold) / statistics.median(hot):.1f}x)"
          f"   target >= 3x: {'met' if ratio >= 3 else 'NOT met'}")
    print(describe_machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
