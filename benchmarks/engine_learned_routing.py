"""Learned routing on the real embedded engine: prompt tokens recomputed, static vs learned steps.

The supervisor workflow (``workflows.supervisor``: 8 workers, Zipf(1.2) routing) runs on the
embedded engine (SmolLM2 by default) through the runtime, one task after another, in four
configurations: static steps and learned steps (``branch_stats``), host tier off and on. The device
pool holds the supervisor's fixed prompt, about 3 of the 8 workers' and room for the running request.

Across runs (the default) the learned configuration starts from statistics trained by running
``--train`` tasks of the same workflow on the tiny-random engine (the route does not depend on the
replies: the router is seeded by task and turn), then keeps learning while it runs. ``--online``
starts it from empty statistics instead: it learns only from the decisions of the measured run
itself (use ``--tasks 1 --rounds 48`` for one long run). Static and learned must produce the same
outputs (caching never changes greedy outputs); the script checks it and prints the recomputed
prompt tokens side by side with their ratio and, for the host-tier-off runs, the bounds replayed
from the recorded brain calls (``_learned_bounds``: best online A0, Bélády, floor) and the
Markov-paging optimum over the run's path.

    python benchmarks/engine_learned_routing.py [--model smollm2-135m] [--tasks 4] [--rounds 8]
        [--fixed 384] [--train 20] [--online]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _engine_workload import describe_machine
from _learned_bounds import brain_bounds, markov_paging, print_brain_bounds, print_markov

from backends.kvcache.trace import BrainRecorder
from backends.local import Engine, EngineConfig
from backends.sim.systems import LEARNED_LOOKAHEAD
from kvflow_orch import BranchStats, run
from workflows.supervisor import routing, supervisor


def prompt_tokens(args, wf) -> int:
    """The longest role prompt in the model's tokens, chat template included (about)."""
    engine = Engine(EngineConfig.build(model=args.model))
    asg = wf.compile()
    longest = max(len(engine.tokenizer.encode(asg.system_prompt(a))) for a in asg.agents)
    engine.close()
    return longest + 32


def run_config(args, wf, learned: BranchStats | None, host: bool) -> dict:
    prompt = args.prompt
    device = prompt * 4 + 2 * (args.dynamic + args.output) + 256  # supervisor + ~3 workers + the running call
    engine = Engine(EngineConfig.build(
        model=args.model, device_tokens=device, host_tokens=prompt * 20 if host else 0, policy="kvflow",
        prefetch=host, prefetch_lookahead=LEARNED_LOOKAHEAD if learned is not None else 1))
    stats = learned.copy() if learned is not None else None
    recorder = None if host else BrainRecorder(engine.scheduler.cache)
    outputs, path, start = [], [], time.perf_counter()
    for t in range(args.tasks):
        result = run(wf, {"task": f"measured-{t}"}, backend=engine, branch_stats=stats, max_steps=4 * args.rounds + 8)
        outputs.append([(c.node, c.completion_tokens) for c in result.calls] + [result.state.get("plan"),
                                                                                result.state.get("work")])
        path += [c.node for c in result.calls]
    wall = time.perf_counter() - start
    counters = engine.stats()
    engine.close()
    return {"outputs": outputs, "wall": wall, "stats": counters, "device": device, "recorder": recorder,
            "cache_config": engine.config.cache, "path": path}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--fixed", type=int, default=384)
    p.add_argument("--dynamic", type=int, default=16)
    p.add_argument("--output", type=int, default=8)
    p.add_argument("--train", type=int, default=20, help="training tasks on tiny-random")
    p.add_argument("--online", action="store_true",
                   help="learned starts from empty statistics (no training): it learns within the measured run")
    p.add_argument("--host-tier", choices=("off", "on", "both"), default="both",
                   help="which host-tier configurations to run (default both)")
    args = p.parse_args()
    wf = supervisor(workers=8, zipf_s=1.2, rounds=args.rounds, fixed=args.fixed, dynamic=args.dynamic,
                    output=args.output)
    print(describe_machine())
    args.prompt = prompt_tokens(args, wf)
    trained = BranchStats()
    if args.online:
        print(f"online: learned starts from empty statistics; {args.tasks} task(s) x {args.rounds} worker turns")
    else:
        trainer = Engine(EngineConfig.build(model="tiny-random"))
        for t in range(args.train):
            run(wf, {"task": f"train-{t}"}, backend=trainer, branch_stats=trained)
        trainer.close()
        probs = trained.probabilities("supervisor", "supervisor")
        print("trained on", args.train, "tasks:", ", ".join(f"{k}={v:.2f}" for k, v in sorted(probs.items())))
    print(f"\n{'host tier':<10} {'steps':<8} {'recomputed':>11} {'device hit':>11} {'host hit':>9} "
          f"{'prefetch hit':>13} {'wall s':>8}")
    ratios, same, bounds = {}, True, {}
    for host in {"off": (False,), "on": (True,), "both": (False, True)}[args.host_tier]:
        res = {}
        for name, learned in (("static", None), ("learned", trained)):
            r = res[name] = run_config(args, wf, learned, host)
            s = r["stats"]
            print(f"{'on' if host else 'off':<10} {name:<8} {s['recomputed_tokens']:>11} {s['device_hit_tokens']:>11} "
                  f"{s['host_hit_tokens']:>9} {s['prefetch_hit_tokens']:>13} {r['wall']:>8.1f}")
        same &= res["static"]["outputs"] == res["learned"]["outputs"]
        ratios[host] = (res["learned"]["stats"]["recomputed_tokens"]
                        / max(1, res["static"]["stats"]["recomputed_tokens"]))
        if not host:
            bounds = brain_bounds({n: res[n]["recorder"] for n in res},
                                  {n: res[n]["stats"]["recomputed_tokens"] for n in res},
                                  res["static"]["cache_config"], routing(8, 1.2)["supervisor"])
            markov = markov_paging(res["static"]["path"], routing(8, 1.2)["supervisor"], "supervisor",
                                   int(res["static"]["device"] // args.prompt))
    print(f"\ndevice pool {res['static']['device']} tokens; {args.tasks} tasks x {args.rounds} worker turns")
    if bounds:
        print_brain_bounds(bounds)
        print_markov(markov)
    for host, ratio in ratios.items():
        print(f"  {'PASS' if ratio <= 1 else 'FAIL'}  learned recomputes <= static, "
              f"host tier {'on' if host else 'off'}: {ratio:.3f}x")
        verdict = "PASS" if ratio <= 0.8 else "FAIL"
        print(f"  {verdict}  recomputed tokens learned / static, host tier {'on' if host else 'off'}: {ratio:.3f}x")
        if host and bounds:
            floor = bounds["floor"] / max(1, res["static"]["stats"]["recomputed_tokens"])
            print(f"        bound (floor / static, host tier on): {floor:.3f}x"
                  + ("  -> 0.8x is infeasible for any policy here" if floor > 0.8 else ""))
        elif bounds:
            static = max(1, bounds["runs"]["static"]["engine"])
            belady, a0 = bounds["belady"] / static, bounds["a0"] / static
            print(f"        bounds (host tier off): best online A0 {a0:.3f}x, belady {belady:.3f}x"
                  + ("  -> 0.8x is infeasible for any eviction policy here" if belady > 0.8 else
                     "  -> 0.8x is infeasible online here" if a0 > 0.8 else ""))
    print(f"  {'PASS' if same else 'FAIL'}  same outputs with static and learned steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
