"""Scheduler overhead of the embedded engine: the share of step time spent
outside the model forward while ``--batch`` requests decode together. Target: <= 10% at batch 8.

"Outside the forward" is everything a pure decode step does besides ``LlamaModel.forward``: draining
commands, admission checks, building the index tensors, sampling, text decoding, stop checks and
delivering events. Steps that also admitted or prefilled are excluded (they are not decode steps).

    python benchmarks/engine_sched_overhead.py [--model smollm2-135m] [--batch 8] [--prompt 128] [--output 64]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_workload import describe_machine, random_tokens, sampling

from backends.base import GenerateRequest
from backends.local import Engine, EngineConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    engine = Engine(EngineConfig.build(model=args.model, device_tokens=args.batch * (args.prompt + args.output) * 2,
                                 host_tokens=0, max_batch=args.batch, dtype=args.dtype))
    requests = [GenerateRequest(random_tokens(engine, args.prompt, seed=i), sampling(args.output))
                for i in range(args.batch)]

    async def go() -> None:
        await asyncio.gather(*(engine.generate(r) for r in requests))

    print(describe_machine())
    asyncio.run(go())
    s = engine.stats()
    engine.close()
    steps, step_s, forward_s = s["decode_steps"], s["decode_step_s"], s["decode_forward_s"]
    overhead = 1 - forward_s / step_s
    print(f"model {args.model}, batch {args.batch}, prompt {args.prompt}, output {args.output}: "
          f"{steps} pure decode steps")
    print(f"decode step {step_s / steps * 1000:.2f} ms, of which forward {forward_s / steps * 1000:.2f} ms; "
          f"{args.batch * steps / step_s:.1f} tokens/s aggregate")
    print(f"scheduler overhead: {overhead * 100:.1f}% of decode step time   "
          f"target <= 10%: {'met' if overhead <= 0.10 else 'NOT met'}")
    print(describe_machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
