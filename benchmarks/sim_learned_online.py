"""Learned routing in the simulator, online and across runs: recomputed prompt tokens vs static.

    python benchmarks/sim_learned_online.py [--seeds 4] [--out benchmarks/results/learned-online]

The workloads of the learned-routing table (``kvflow bench sim --workload supervisor|swarm
--routed-table``): 8 workers (swarm: 6 agents), Zipf(1.2) routing, 40 turns, ~4,100-token role
prompts, 1 and 16 instances, host tier on and off, the table's device pools. Recomputed tokens do
not depend on the hardware or model profile (the same requests reach the same brain in the same
order), so one profile (Llama-3.1-8B on H100) stands for the table's four.

``kvflow-learned`` runs two ways on each configuration and seed:

* **online**: from empty statistics, learning only within the measured run (``--online``);
* **across runs**: after 20 routing-only training walks per instance (the table's setting).

A single 40-turn run is noisy (a handful of evictions decide it), so each configuration runs
``--seeds`` seeded workloads and the figures are their sums; the per-seed ratios are printed too.
Beside each result: Bélády on the same requests (offline optimal), the floor (a pool that holds
everything: the ``infinite`` system) and, for the swarm with one instance and no host tier, the
Markov-paging optimum (the best online policy knowing the true transition matrix; call-hit share).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.sim.markov import chain_of_routing, hit_rates
from backends.sim.profiles import load_hardware, load_model
from backends.sim.simulate import simulate
from backends.sim.systems import get_system
from kvflow_orch.harness.scenarios import TRAIN_RUNS, routed_device_tokens, routed_workload

H100, LLAMA = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
MODES = {"online": 0, "across runs": TRAIN_RUNS}


def recomputed(system: str, w, device: int, host: int | None, future=None) -> tuple[int, object]:
    r = simulate(get_system(system), w, H100, LLAMA, device_tokens=device, host_tokens=host, future=future)
    return r.stats["recomputed_tokens"], r


def markov(w, device: int, path) -> dict | None:
    spec = w.instances[0].spec
    agents = sorted(spec.fixed)
    if set(spec.routing) != set(agents):
        return None  # the supervisor's workers do not route
    room = spec.dynamic_tokens + spec.output_tokens + 64
    k = int((device - room) / (sum(len(spec.fixed[a]) for a in agents) / len(agents)) + 0.01)
    chain = chain_of_routing(spec.routing, agents, start=path[0])
    long = hit_rates(chain, k, [chain.walk(100_000, random.Random(0))])
    own = hit_rates(chain, k, [[agents.index(a) for a in path]])
    return {"k": k, "long": long.__dict__, "own": own.__dict__}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--workloads", nargs="+", default=["supervisor", "swarm"])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    lines = [f"python benchmarks/sim_learned_online.py --seeds {args.seeds}   ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"uptime: {uptime()})", ""]
    head = (f"{'workload':<11} {'config':<12} {'mode':<12} {'static':>10} {'learned':>10} {'ratio':>7} "
            f"{'belady':>7} {'floor':>7}  {'seeds worse':>11}  per-seed learned/static")
    lines += [head, "-" * len(head)]
    print("\n".join(lines), flush=True)
    rows, checks, markovs = [], [], []
    for name in args.workloads:
        for instances in (1, 16):
            for host in (None, 0):
                label = f"x{instances} {'host' if host is None else 'nohost'}"
                base = {"static": 0, "belady": 0, "floor": 0}
                learned = {m: [] for m in MODES}
                statics = []
                for seed in range(args.seeds):
                    w = routed_workload(name, instances=instances, seed=seed)
                    device = routed_device_tokens(w)
                    st, sr = recomputed("kvflow", w, device, host)
                    statics.append(st)
                    base["static"] += st
                    base["belady"] += recomputed("belady", w, device, host, sr.admission_order)[0]
                    base["floor"] += recomputed("infinite", w, device, host)[0]
                    for mode, train in MODES.items():
                        wm = routed_workload(name, instances=instances, seed=seed, train_runs=train)
                        learned[mode].append(recomputed("kvflow-learned", wm, device, host)[0])
                    if seed == 0 and instances == 1 and host == 0:
                        mb = markov(w, device, sr.paths[0])
                        if mb:
                            markovs.append((name, label, mb))
                for mode in MODES:
                    total = sum(learned[mode])
                    ratio = total / max(1, base["static"])
                    per = [cost / max(1, static) for cost, static in zip(learned[mode], statics, strict=True)]
                    worse = sum(x > 1 for x in per)
                    static_total = max(1, base["static"])
                    line = (f"{name:<11} {label:<12} {mode:<12} {base['static']:>10} {total:>10} {ratio:>6.3f}x "
                            f"{base['belady'] / static_total:>6.3f}x {base['floor'] / static_total:>6.3f}x"
                            f"  {worse:>5}/{args.seeds:<5}  " + " ".join(f"{x:.3f}" for x in per))
                    print(line, flush=True)
                    lines.append(line)
                    rows.append({"workload": name, "config": label, "mode": mode, **base, "learned": total,
                                 "per_seed": per})
                    checks.append((f"{name} {label} {mode}", ratio))
    lines.append("")
    for name, label, mb in markovs:
        lr, own = mb["long"], mb["own"]
        line = (f"Markov paging bound, {name} {label} (pool of {mb['k']} agent prefixes, call-hit share): "
                f"{lr['calls']:,} calls: LRU {lr['lru']:.1%}, expected steps {lr['expected_steps']:.1%}, best online "
                f"{lr['best_online']:.1%}, Bélády {lr['belady']:.1%}; seed 0's {own['calls']}-call path: LRU "
                f"{own['lru']:.1%}, expected steps {own['expected_steps']:.1%}, best online {own['best_online']:.1%}, "
                f"Bélády {own['belady']:.1%}")
        lines.append(line)
    lines.append("\nTargets")
    for what, ratio in checks:
        lines.append(f"  {'PASS' if ratio <= 1 else 'FAIL'}  learned recomputes <= static, {what} "
                     f"(sum over {args.seeds} seeds): {ratio:.3f}x")
    lines.append(f"uptime after: {uptime()}")
    print("\n".join(lines[len(lines) - len(markovs) - len(checks) - 3:]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
        (args.out / "results.json").write_text(json.dumps({"rows": rows, "markov": markovs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
