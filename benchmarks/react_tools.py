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
  does on a tool-call reply). Bélády: the schedule each run executed on the engine's brain,
  replayed with Bélády's eviction, as on the simulator. Greedy outputs must be identical across
  the three runs.
* **Simulator** (roofline time of ``--sim-hardware`` / ``--sim-model``, full tool durations): each
  run records the schedule it executed (admissions and releases, concurrent requests included) and
  Bélády is that schedule replayed through the brain with Bélády's eviction
  (``backends/kvcache/trace.py``, ``replay_schedule``): every run is compared with the offline
  order on its own schedule (``/ Bélády``). Replayed with the run's own policy LRU's schedule gives
  back LRU's count exactly (checked, printed). Bounds beside the runs: **best online**, kvflow
  with continuations told each pause's exact duration (``resume_in_s`` = the tool's real time,
  ``exact_resume``); **distribution-aware online** (``dist``), kvflow with continuations told each
  tool's duration distribution but not its samples (``known_durations``: the most that learning
  the durations can give the ranking); and the **floor**, the same requests on a pool that holds
  everything (no eviction at all: no policy can beat it). **outlasting**: kvflow with continuations
  whose deadline is cut to 2 s (``continuation_max_s``), so every slow tool outlasts it: the
  issue's "no regression where tools outlast their deadline", against kvflow without continuations.
  A finished job's client sends ``done`` (engine and simulator). ``--matrix`` runs every
  ``--agents-list`` x ``--slow-list`` pair on the simulator and prints one summary row each (with
  ``--seeds N``: for N workload seeds, then each pair's mean over them).

Prints mean job completion time and recomputed tokens per run and their ratios to LRU, with
``uptime``; writes ``react_tools.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from statistics import mean
from typing import Any

from backends.kvcache import CacheConfig
from backends.kvcache.trace import ScheduleRecorder, replay_schedule
from backends.sim import CostModel, get_system, load_hardware, load_model
from backends.sim.react import AgentPlan, ReactSpec, react_plan, run_react
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

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
    recorder = ScheduleRecorder(engine.scheduler.cache)  # before any request: the loop thread drives it
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
            result = await engine.generate(greq)
            replies.append(result.output_ids)
            if turn + 1 < len(plan.outputs):
                tool, seconds, _ = plan.tools[turn]
                engine.pause(greq, [tool.name])
                await asyncio.sleep(seconds * time_scale)
        engine.apply_steps(StepsUpdate(workflow_id=plan.name, done=True))
        outputs[plan.name] = replies
        return time.perf_counter() - start

    try:
        jobs = await asyncio.gather(*(job(p) for p in plans))
        stats = engine.stats()
    finally:
        await engine.shutdown()
    config = CacheConfig(device_tokens=pool, policy="lru", prefetch=False)
    belady = replay_schedule(recorder.events, config, belady=True).stats.recomputed_tokens
    return {"mean_job_s": mean(jobs), "recomputed_tokens": stats["recomputed_tokens"],
            "belady_recomputed_tokens": belady, **{k: v for k, v in stats.items() if k.startswith("continuations_")},
            "_outputs": outputs, "_schedule": recorder.events}


def engine_part(plans: list[AgentPlan], args: argparse.Namespace) -> dict[str, Any]:
    pool = pool_for(plans, args.pool_share)
    runs = {name: asyncio.run(engine_run(plans, args.model, pool, policy, cont, args.time_scale, args.output_tokens))
            for name, policy, cont in RUNS}
    first = runs["lru"]
    same = all(r["_outputs"] == first["_outputs"] for r in runs.values())
    lru_again = replay_schedule(first["_schedule"], CacheConfig(device_tokens=pool, policy="lru", prefetch=False))
    return {"pool_tokens": pool, "time_scale": args.time_scale, "greedy_outputs_identical": same,
            "lru_schedule_replayed_with_lru": lru_again.stats.recomputed_tokens,
            "runs": {n: {k: v for k, v in r.items() if not k.startswith("_")} for n, r in runs.items()}}


# ---- the simulator ----------------------------------------------------------------------
def sim_part(plans: list[AgentPlan], args: argparse.Namespace) -> dict[str, Any]:
    cost = CostModel(load_hardware(args.sim_hardware), load_model(args.sim_model))
    system = get_system("gpu-only")  # no host tier: what is evicted is recomputed
    pool = pool_for(plans, args.pool_share)

    def config(policy: str, cont: bool, size: int = pool) -> CacheConfig:
        return CacheConfig(device_tokens=size, policy=policy, continuations=cont, prefetch=False,
                           namespace_cap_tokens=size)

    results = {name: run_react(plans, system, cost, config(policy, cont)) for name, policy, cont in RUNS}
    results["best-online"] = run_react(plans, system, cost, config("kvflow", True), exact_resume=True)
    results["dist-online"] = run_react(plans, system, cost, config("kvflow", True), known_durations=True)
    results["outlasting"] = run_react(plans, system, cost, replace(config("kvflow", True), continuation_max_s=2.0))
    everything = sum(len(p.prompt(len(p.outputs) - 1)) + len(p.outputs[-1]) for p in plans)
    results["floor"] = run_react(plans, system, cost, config("lru", False, everything))
    runs = {}
    for name, result in results.items():
        runs[name] = result.to_json()
        if name != "floor":  # Bélády on the schedule this run executed
            belady = replay_schedule(result.schedule, config("lru", False), belady=True)
            runs[name]["belady_recomputed_tokens"] = belady.stats.recomputed_tokens
    lru_again = replay_schedule(results["lru"].schedule, config("lru", False)).stats.recomputed_tokens
    return {"pool_tokens": pool, "hardware": args.sim_hardware, "model": args.sim_model,
            "lru_schedule_replayed_with_lru": lru_again, "runs": runs}


def sim_spec(args: argparse.Namespace, agents: int, slow_share: float, seed: int) -> ReactSpec:
    return ReactSpec(agents=agents, turns=args.turns, system_tokens=1024, task_tokens=256, output_tokens=64,
                     result_tokens=256, slow_share=slow_share, seed=seed)


RATIOS = (  # (row key, column title): the summary of one matrix cell
    ("jct_lru_over_cont", "JCT LRU/cont"), ("jct_lru_over_floor", "LRU/floor"),
    ("jct_lru_over_best_online", "LRU/best"), ("jct_cont_over_plain", "cont/plain"),
    ("jct_outlasting_over_plain", "outl/plain"), ("cont_over_belady", "cont/Bél"),
    ("plain_over_belady", "plain/Bél"), ("lru_over_belady", "LRU/Bél"), ("best_over_belady", "best/Bél"),
    ("dist_over_belady", "dist/Bél"),
)


def matrix_row(agents: int, share: float, seed: int, part: dict[str, Any]) -> dict[str, Any]:
    runs = part["runs"]
    lru, plain, cont = runs["lru"], runs["kvflow"], runs["kvflow+continuations"]

    def vs_belady(r: dict[str, Any]) -> float:
        return r["recomputed_tokens"] / max(1, r["belady_recomputed_tokens"])

    return {"agents": agents, "slow_share": share, "seed": seed, "pool_tokens": part["pool_tokens"],
            "jct_lru_over_cont": lru["mean_job_s"] / cont["mean_job_s"],
            "jct_lru_over_floor": lru["mean_job_s"] / runs["floor"]["mean_job_s"],
            "jct_lru_over_best_online": lru["mean_job_s"] / runs["best-online"]["mean_job_s"],
            "jct_cont_over_plain": cont["mean_job_s"] / plain["mean_job_s"],
            "jct_outlasting_over_plain": runs["outlasting"]["mean_job_s"] / plain["mean_job_s"],
            "cont_over_belady": vs_belady(cont), "plain_over_belady": vs_belady(plain),
            "lru_over_belady": vs_belady(lru), "best_over_belady": vs_belady(runs["best-online"]),
            "dist_over_belady": vs_belady(runs["dist-online"]),
            "expired": cont.get("continuations_expired", 0), "runs": runs}


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}\n{'agents':>6} {'slow':>5} " + " ".join(f"{name:>12}" for _, name in RATIOS))
    for row in rows:
        print(f"{row['agents']:>6} {row['slow_share']:>5} " + " ".join(f"{row[key]:>11.3f}x" for key, _ in RATIOS))


def matrix(args: argparse.Namespace) -> dict[str, Any]:
    """Every agents x slow-share pair on the simulator, for each of ``--seeds`` workload seeds
    (from ``--seed``): a row each, then each pair's mean over the seeds."""
    rows, means = [], []
    for agents in args.agents_list:
        for share in args.slow_list:
            cell = [matrix_row(agents, share, seed, sim_part(react_plan(sim_spec(args, agents, share, seed)), args))
                    for seed in range(args.seed, args.seed + args.seeds)]
            rows += cell
            means.append({"agents": agents, "slow_share": share,
                          **{key: mean(r[key] for r in cell) for key, _ in RATIOS},
                          "max_cont_over_belady": max(r["cont_over_belady"] for r in cell)})
    print_rows(f"simulator, seed {args.seed}", [r for r in rows if r["seed"] == args.seed])
    if args.seeds > 1:
        print_rows(f"simulator, mean over seeds {args.seed}-{args.seed + args.seeds - 1}", means)
    return {"rows": rows, "means": means}


# ---- report -----------------------------------------------------------------------------
def print_table(title: str, part: dict[str, Any]) -> None:
    runs = part["runs"]
    lru = runs["lru"]
    print(f"\n{title} (device pool {part['pool_tokens']} tokens)")
    print(f"  {'run':<22} {'mean JCT s':>10} {'LRU/run':>8} {'recomputed':>11} {'/ LRU':>7} "
          f"{'Bélády':>8} {'/ Bélády':>8} {'kept':>5} {'reused':>6} {'expired':>7}")
    for name, r in runs.items():
        belady = r.get("belady_recomputed_tokens")
        own = "" if belady is None else f"{belady:>8} {r['recomputed_tokens'] / max(1, belady):>7.3f}x"
        print(f"  {name:<22} {r['mean_job_s']:>10.3f} {lru['mean_job_s'] / r['mean_job_s']:>7.3f}x "
              f"{r['recomputed_tokens']:>11} {r['recomputed_tokens'] / max(1, lru['recomputed_tokens']):>6.3f}x "
              f"{own:<17} {r.get('continuations_kept', 0):>5} {r.get('continuations_reused', 0):>6} "
              f"{r.get('continuations_expired', 0):>7}")
    if "lru_schedule_replayed_with_lru" in part:
        print(f"  LRU's schedule replayed with LRU: {part['lru_schedule_replayed_with_lru']} recomputed "
              f"(the run: {lru['recomputed_tokens']})")


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
    parser.add_argument("--matrix", action="store_true", help="simulator only: every --agents-list x --slow-list pair")
    parser.add_argument("--agents-list", type=_ints, default=[8, 16, 32])
    parser.add_argument("--slow-list", type=_floats, default=[0.0, 0.25, 1.0])
    parser.add_argument("--seeds", type=int, default=1, help="--matrix: workload seeds from --seed")
    args = parser.parse_args()
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.matrix:
        out["matrix"] = matrix(args)
    elif not args.skip_sim:
        out["sim"] = sim_part(react_plan(sim_spec(args, args.agents, args.slow_share, args.seed)), args)
        print_table(f"simulator: {args.agents} agents x {args.turns} turns, {args.sim_model} on {args.sim_hardware}",
                    out["sim"])
    if not args.skip_engine and not args.matrix:
        spec = ReactSpec(agents=args.engine_agents, turns=args.engine_turns, system_tokens=384, task_tokens=64,
                         output_tokens=args.output_tokens, result_tokens=48, slow_share=args.slow_share, seed=args.seed,
                         vocab=250)
        out["engine"] = engine_part(react_plan(spec), args)
        e = out["engine"]
        print_table(f"embedded engine: {args.engine_agents} agents x {args.engine_turns} turns, {args.model}, "
                    f"tool pauses x {args.time_scale}", e)
        print(f"  greedy outputs identical across runs: {e['greedy_outputs_identical']}")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "react_tools.json").write_text(json.dumps(out, indent=2) + "\n")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


if __name__ == "__main__":
    main()
