"""ReAct agents with tool pauses (issue 24, "Measure"): LRU, kvflow without continuations and kvflow
with them, plus Bélády on the same requests, side by side in one run, on the embedded engine and in
the simulator.

    flock /tmp/kvflow-timing.lock env PYTHONPATH=$PWD .venv/bin/python benchmarks/react_tools.py \\
        [--agents 32] [--turns 6] [--engine-agents 8] [--engine-turns 4] [--slow-share 0.25] \\
        [--pool-share 0.45] [--time-scale 1.0] \\
        [--model tiny-random] [--sim-hardware a10g --sim-model llama-3.1-8b] [--out DIR]

Workload (``backends/sim/react.py``, the same generator on both): ``--agents`` concurrent ReAct jobs
of ``--turns`` model calls (``--engine-agents`` / ``--engine-turns`` on the engine, whose runs take
real time); between two calls a tool runs, fast (0.1-1 s) or, with probability
``--slow-share``, slow (5-30 s); the next call sends the whole conversation plus the tool's result.
Each agent's hint names its job and declares its system prompt fixed. The device pool holds
``--pool-share`` of the sum of the paused conversations (their last prompt), no host tier, and
one namespace may protect the whole pool (``namespace_cap_tokens``: the benchmark is one tenant).

* **Engine** (real model, greedy): tool pauses are real sleeps scaled by ``--time-scale`` (printed);
  with continuations each reply that ends a turn is reported with ``engine.pause`` (what the server
  does on a tool-call reply). Bélády: the engine's requests replayed through the brain one at a time
  (``backends/kvcache/trace.py``) in arrival order, with LRU's replay beside it for scale (a
  sequential replay has only one request's room locked, so both are below the concurrent runs').
  Greedy outputs must be identical across the three runs.
* **Simulator** (roofline time of ``--sim-hardware`` / ``--sim-model``, full tool durations):
  Bélády is the same run with Bélády's eviction given an admission sequence as its future: the kvflow
  run's, then each Bélády run's own until it repeats (at most four runs; the fewest recomputed kept).

Prints mean job completion time and recomputed tokens per run and their ratios to LRU, with
``uptime``; writes ``react_tools.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from pathlib import Path
from statistics import mean
from typing import Any

from backends.kvcache import BeladyPolicy, CacheConfig
from backends.kvcache.trace import RecordedRequest, replay
from backends.sim import CostModel, get_system, load_hardware, load_model
from backends.sim.react import AgentPlan, ReactSpec, react_plan, run_react
from kvflow_orch.protocol import KVFlowHint

BELADY_ROUNDS = 4
RUNS = (("lru", "lru", False), ("kvflow", "kvflow", False), ("kvflow+continuations", "kvflow", True))


def pool_for(plans: list[AgentPlan], share: float) -> int:
    paused = sum(len(p.prompt(len(p.outputs) - 1)) for p in plans)
    return max(1, int(paused * share))


# ---- the embedded engine ----------------------------------------------------------------
async def engine_run(plans: list[AgentPlan], model: str, pool: int, policy: str, continuations: bool,
                     time_scale: float, output_tokens: int) -> dict[str, Any]:
    from backends.base import GenerateRequest, SamplingParams
    from backends.local import Engine, EngineConfig

    engine = Engine(EngineConfig.build(model=model, device_tokens=pool, host_tokens=0, policy=policy,
                                       continuations=continuations, namespace_cap_tokens=pool, prefetch=False))
    await engine.start()
    requests: list[tuple[float, tuple[int, ...], tuple[int, ...]]] = []
    outputs: dict[str, list[tuple[int, ...]]] = {}

    async def job(plan: AgentPlan) -> float:
        await asyncio.sleep(plan.start_s * time_scale)
        start = time.perf_counter()
        replies: list[tuple[int, ...]] = []
        for turn in range(len(plan.outputs)):
            prompt = plan.system + plan.task
            for i, reply in enumerate(replies):
                prompt += reply + plan.tools[i][2]
            hint = KVFlowHint(workflow_id=plan.name, agent=plan.name, steps={plan.name: 0})
            greq = GenerateRequest(prompt, SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True),
                                   hint=hint, fixed_prefix_tokens=len(plan.system))
            arrival = time.perf_counter()
            result = await engine.generate(greq)
            requests.append((arrival, prompt, result.output_ids))
            replies.append(result.output_ids)
            if turn + 1 < len(plan.outputs):
                tool, seconds, _ = plan.tools[turn]
                engine.pause(greq, [tool.name])
                await asyncio.sleep(seconds * time_scale)
        outputs[plan.name] = replies
        return time.perf_counter() - start

    try:
        jobs = await asyncio.gather(*(job(p) for p in plans))
        stats = engine.stats()
    finally:
        await engine.shutdown()
    requests.sort(key=lambda r: r[0])
    return {"mean_job_s": mean(jobs), "recomputed_tokens": stats["recomputed_tokens"],
            **{k: v for k, v in stats.items() if k.startswith("continuations_")},
            "_outputs": outputs, "_requests": [(p, o) for _, p, o in requests]}


def sequential_replays(requests: list[tuple[tuple[int, ...], tuple[int, ...]]], pool: int) -> dict[str, int]:
    """Recomputed tokens of the engine's requests replayed one at a time: LRU and Bélády."""
    events = [("request", RecordedRequest(p, 0, len(p) + len(o) - 1, (p + o)[:-1])) for p, o in requests]
    config = CacheConfig(device_tokens=pool, policy="lru", prefetch=False)
    return {"lru_replay": replay(events, config).stats.recomputed_tokens,
            "belady_replay": replay(events, config, belady=True).stats.recomputed_tokens}


def engine_part(plans: list[AgentPlan], args: argparse.Namespace) -> dict[str, Any]:
    pool = pool_for(plans, args.pool_share)
    runs = {name: asyncio.run(engine_run(plans, args.model, pool, policy, cont, args.time_scale, args.output_tokens))
            for name, policy, cont in RUNS}
    first = runs["lru"]
    same = all(r["_outputs"] == first["_outputs"] for r in runs.values())
    bounds = sequential_replays(first["_requests"], pool)
    return {"pool_tokens": pool, "time_scale": args.time_scale, "greedy_outputs_identical": same,
            "runs": {n: {k: v for k, v in r.items() if not k.startswith("_")} for n, r in runs.items()}, **bounds}


# ---- the simulator ----------------------------------------------------------------------
def sim_part(plans: list[AgentPlan], args: argparse.Namespace) -> dict[str, Any]:
    cost = CostModel(load_hardware(args.sim_hardware), load_model(args.sim_model))
    system = get_system("gpu-only")  # no host tier: what is evicted is recomputed
    pool = pool_for(plans, args.pool_share)

    def config(policy: str, cont: bool) -> CacheConfig:
        return CacheConfig(device_tokens=pool, policy=policy, continuations=cont, prefetch=False,
                           namespace_cap_tokens=pool)

    results = {name: run_react(plans, system, cost, config(policy, cont)) for name, policy, cont in RUNS}
    # Bélády needs the admission sequence it will see, which depends on its own timing: start from
    # the kvflow run's and rerun on each run's own admissions until they repeat (or BELADY_ROUNDS)
    future = results["kvflow+continuations"].admissions
    belady = None
    for _ in range(BELADY_ROUNDS):
        attempt = run_react(plans, system, cost, config("lru", False), policy=BeladyPolicy(future))
        if belady is None or attempt.recomputed_tokens < belady.recomputed_tokens:
            belady = attempt
        if attempt.admissions == future:
            break
        future = attempt.admissions
    runs = {name: r.to_json() for name, r in results.items()}
    runs["belady"] = belady.to_json()
    return {"pool_tokens": pool, "hardware": args.sim_hardware, "model": args.sim_model, "runs": runs}


# ---- report -----------------------------------------------------------------------------
def print_table(title: str, part: dict[str, Any]) -> None:
    runs = part["runs"]
    lru = runs["lru"]
    print(f"\n{title} (device pool {part['pool_tokens']} tokens)")
    print(f"  {'run':<22} {'mean JCT s':>10} {'LRU/run':>8} {'recomputed':>11} {'/ LRU':>7} "
          f"{'kept':>5} {'reused':>6} {'expired':>7}")
    for name, r in runs.items():
        print(f"  {name:<22} {r['mean_job_s']:>10.3f} {lru['mean_job_s'] / r['mean_job_s']:>7.3f}x "
              f"{r['recomputed_tokens']:>11} {r['recomputed_tokens'] / max(1, lru['recomputed_tokens']):>6.3f}x "
              f"{r.get('continuations_kept', 0):>5} {r.get('continuations_reused', 0):>6} "
              f"{r.get('continuations_expired', 0):>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--engine-agents", type=int, default=8)
    parser.add_argument("--engine-turns", type=int, default=4)
    parser.add_argument("--slow-share", type=float, default=0.25)
    parser.add_argument("--pool-share", type=float, default=0.45)
    parser.add_argument("--time-scale", type=float, default=1.0, help="engine only: tool sleeps x this")
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--sim-hardware", default="a10g")
    parser.add_argument("--sim-model", default="llama-3.1-8b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    sim_spec = ReactSpec(agents=args.agents, turns=args.turns, system_tokens=1024, task_tokens=256, output_tokens=64,
                         result_tokens=256, slow_share=args.slow_share, seed=args.seed)
    if not args.skip_sim:
        out["sim"] = sim_part(react_plan(sim_spec), args)
        print_table(f"simulator: {args.agents} agents x {args.turns} turns, {args.sim_model} on {args.sim_hardware}",
                    out["sim"])
    if not args.skip_engine:
        spec = ReactSpec(agents=args.engine_agents, turns=args.engine_turns, system_tokens=384, task_tokens=64,
                         output_tokens=args.output_tokens, result_tokens=48, slow_share=args.slow_share, seed=args.seed,
                         vocab=250)
        out["engine"] = engine_part(react_plan(spec), args)
        e = out["engine"]
        print_table(f"embedded engine: {args.engine_agents} agents x {args.engine_turns} turns, {args.model}, "
                    f"tool pauses x {args.time_scale}", e)
        print(f"  sequential brain replays of the same requests: LRU {e['lru_replay']}, "
              f"Bélády {e['belady_replay']} recomputed tokens")
        print(f"  greedy outputs identical across runs: {e['greedy_outputs_identical']}")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "react_tools.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
