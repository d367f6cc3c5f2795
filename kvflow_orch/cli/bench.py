"""``kvflow bench``: simulate workflows on a hardware profile, replay recorded traces, calibrate.

    kvflow bench sim [--standard] [--hardware H] [--model M] [--workload W] [--online] [--fixed N ...]
                     [--output N ...] [--branches N ...] [--instances N ...] [--systems S ...]
                     [--device-tokens N] [--host-tokens N] [--out DIR] [--no-plots]
    kvflow bench replay TRACE [--hardware H] [--model M] [--systems S ...] [--out DIR]
    kvflow bench calibrate [--model tiny-random|smollm2-135m|DIR] [--out PROFILE.json] [--compare]

Every run prints the table (system x config: latency, speedup over hicache and gpu-only, gap to
infinite, device-hit ratio) and writes ``results.json`` plus one PNG per group under ``--out``
(default ``./kvflow-results/<name>`` under the current directory, printed before the run starts).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from backends.sim.profiles import ProfileError, available_profiles, load_hardware, load_model
from backends.sim.systems import DEFAULT_SYSTEMS, SYSTEM_NAMES

__all__ = ["add_arguments", "main"]

DEFAULT_OUT = Path("kvflow-results")
"""Relative to the current directory; the repository's committed results are written with ``--out``."""


def _common(p: argparse.ArgumentParser, bundled: dict[str, list[str]]) -> None:
    p.add_argument("--hardware", default="h100-sxm", help="bundled name (%s) or a profile .json"
                   % ", ".join(bundled["hardware"]))
    p.add_argument("--model", default="qwen2.5-32b", help="bundled name (%s) or a profile .json"
                   % ", ".join(bundled["model"]))
    p.add_argument("--systems", nargs="+", default=None, choices=SYSTEM_NAMES, metavar="SYSTEM",
                   help="systems to compare, of %s (default: all but oracle; the routed table adds oracle)"
                   % ", ".join(SYSTEM_NAMES))
    p.add_argument("--device-tokens", type=int, default=None, help="cap the device KV pool (tokens)")
    p.add_argument("--host-tokens", type=int, default=None, help="host KV pool (tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help=f"result folder (default {DEFAULT_OUT}/<name>)")
    p.add_argument("--no-plots", action="store_true", help="skip the matplotlib PNGs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="{sim,replay,calibrate}")
    bundled = available_profiles()  # read the profile folder once, not per option
    sim = sub.add_parser("sim", help="simulate workflows on a hardware profile")
    _common(sim, bundled)
    sim.add_argument("--standard", action="store_true",
                     help="run the standard sweep (the committed benchmarks/results); other workload flags are ignored")
    sim.add_argument("--workload", default="synthetic",
                     choices=("synthetic", "concurrent", "metagpt", "peer", "supervisor", "swarm"))
    sim.add_argument("--zipf", type=float, default=1.2, help="routing skew of supervisor and swarm (default 1.2)")
    sim.add_argument("--routed-table", action="store_true",
                     help="supervisor/swarm: run the learned-routing table (2 models x H100, A10G@2GB/s x "
                          "1, 16 instances x host tier on/off); other workload flags are ignored")
    sim.add_argument("--online", action="store_true",
                     help="supervisor/swarm: kvflow-learned starts from empty statistics and learns within each "
                          "run (no training walks first)")
    sim.add_argument("--fixed", type=int, nargs="+", default=None,
                     help="fixed-prefix tokens (default 4096; synthetic and concurrent only)")
    sim.add_argument("--dynamic", type=int, default=None, help="dynamic tokens (default 32; 256 concurrent/graphs)")
    sim.add_argument("--output", type=int, nargs="+", default=[32])
    sim.add_argument("--branches", type=int, nargs="+", default=None,
                     help="candidates per stage (default 1; synthetic and concurrent only)")
    sim.add_argument("--instances", type=int, nargs="+", default=[1])
    sim.add_argument("--agents", type=int, default=None,
                     help="agents (default 10; supervisor: workers, default 8; swarm: default 6)")
    sim.add_argument("--rounds", type=int, default=None, help="rounds (default 10; 2 for concurrent)")
    rep = sub.add_parser("replay", help="replay a `kvflow run --record` trace")
    rep.add_argument("trace", type=Path)
    _common(rep, bundled)
    cal = sub.add_parser("calibrate", help="measure the embedded engine and write a hardware profile")
    cal.add_argument("--model", default="tiny-random", help="embedded engine model (tiny-random, smollm2-135m, DIR)")
    cal.add_argument("--out", type=Path, default=None,
                     help=f"profile to write (default {DEFAULT_OUT}/calibrated-<model>.json)")
    cal.add_argument("--compare", action="store_true",
                     help="also run the synthetic workflow on the engine and on the simulator and report the error")
    cal.add_argument("--agents", type=int, default=4)
    cal.add_argument("--fixed", type=int, default=256)
    cal.add_argument("--rounds", type=int, default=2)


def main(args: argparse.Namespace) -> int:
    command = getattr(args, "bench_command", None)
    if command is None:
        print("kvflow bench: choose a subcommand: sim, replay or calibrate (see kvflow bench -h)", file=sys.stderr)
        return 2
    try:
        if command == "calibrate":
            from .calibrate import main as calibrate_main

            return calibrate_main(args)
        return _simulate(args)
    except (ProfileError, ValueError, OSError) as exc:
        print(f"kvflow bench {command}: {exc}", file=sys.stderr)
        return 2


def _scenarios(args: argparse.Namespace):
    from ..harness.scenarios import (ROUTED_WORKLOADS, graph_workload, routed_device_tokens, routed_scenarios,
                                     routed_workload, standard_scenarios, synthetic, with_stats)
    from ..harness.sweep import Scenario

    if args.bench_command == "replay":
        from backends.sim.replay import load_trace

        w = with_stats(load_trace(args.trace, seed=args.seed))
        hw, model = load_hardware(args.hardware), load_model(args.model)
        return "replay", [Scenario("replay", hw, model, w, args.device_tokens, args.host_tokens)]
    online = getattr(args, "online", False)
    if online and (args.standard or args.workload not in ROUTED_WORKLOADS):
        raise ValueError(f"--online applies to --workload {' or '.join(ROUTED_WORKLOADS)} (learned routing), "
                         f"not to {'--standard' if args.standard else args.workload}")
    train = {"train_runs": 0} if online else {}
    suffix = "-online" if online else ""
    if args.standard:
        return "standard", standard_scenarios(args.seed)
    if args.workload in ROUTED_WORKLOADS:
        if args.routed_table:
            return f"{args.workload}-table{suffix}", routed_scenarios(args.workload, args.seed, **train)
        hw, model = load_hardware(args.hardware), load_model(args.model)
        out = []
        for n in args.instances:
            w = routed_workload(args.workload, agents=args.agents, zipf_s=args.zipf, rounds=args.rounds,
                                output=args.output[0], instances=n, seed=args.seed, **train,
                                **({"dynamic": args.dynamic} if args.dynamic is not None else {}))
            device = args.device_tokens if args.device_tokens is not None else routed_device_tokens(w)
            out.append(Scenario(args.workload, hw, model, w, device, args.host_tokens))
        return args.workload + suffix, out
    hw, model = load_hardware(args.hardware), load_model(args.model)
    out = []
    concurrent = args.workload == "concurrent"
    dynamic = args.dynamic if args.dynamic is not None else (256 if args.workload != "synthetic" else 32)
    graph = args.workload in ("metagpt", "peer")
    if graph and (len(args.output) > 1 or args.fixed or args.branches):
        # the graphs' prompts are their agents' own; a grid over them would be silently ignored
        raise ValueError(f"--workload {args.workload} takes one --output value and no --fixed or --branches")
    for n in args.instances:
        if graph:
            w = graph_workload(args.workload, dynamic=dynamic, output=args.output[0],
                               loop_limit=args.rounds or 3, instances=n, tenant_header=1024, seed=args.seed)
            out.append(Scenario(args.workload, hw, model, w, args.device_tokens, args.host_tokens))
            continue
        for branches in args.branches or [1]:
            for output in args.output:
                for fixed in args.fixed or [4096]:
                    w = synthetic(fixed=fixed, dynamic=dynamic, output=output, branches=branches,
                                  n_agents=args.agents or 10, rounds=args.rounds or (2 if concurrent else 10),
                                  instances=n, seed=args.seed)
                    out.append(Scenario(args.workload, hw, model, w, args.device_tokens, args.host_tokens))
    return args.workload, out


def _simulate(args: argparse.Namespace) -> int:
    from ..harness.report import format_table, plot, rows, write_json
    from ..harness.sweep import run_scenarios
    from ..harness.targets import check_targets, learned_bounds

    name, scenarios = _scenarios(args)
    if args.systems is None:  # the routed table's bounds include the perfect-prediction oracle
        args.systems = list(SYSTEM_NAMES if "-table" in name else DEFAULT_SYSTEMS)
    out = args.out or (DEFAULT_OUT / name)
    print(f"kvflow bench {args.bench_command}: {len(scenarios)} scenarios x {len(args.systems)} systems; results go to "
          f"{out.resolve()}", file=sys.stderr, flush=True)
    start = time.perf_counter()

    def progress(sr) -> None:
        print(f"  {sr.scenario.group:<24} {sr.scenario.workload.name:<12} "
              f"{sr.scenario.model.name} on {sr.scenario.hardware.name}: {sr.wall_s:.1f}s", file=sys.stderr)

    results = run_scenarios(scenarios, args.systems, progress)
    wall = time.perf_counter() - start
    table = rows(results)
    checks = check_targets(results, wall if name == "standard" else None)
    summary = format_table(table)
    bounds = learned_bounds(results)
    if bounds:
        summary += "\n\n" + "\n".join(bounds)
    if checks:
        summary += "\n\nTargets\n" + "\n".join(
            f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in checks)
    print(summary)
    meta = {"command": "kvflow bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
            "wall_s": wall, "scenarios": len(scenarios), "systems": list(args.systems),
            "targets": [c._asdict() for c in checks]}
    path = write_json(table, meta, out / "results.json")
    (out / "summary.txt").write_text(summary + "\n")
    written = [path, out / "summary.txt"]
    if not args.no_plots:
        written += plot(results, out)
    print(f"\n{len(scenarios)} scenarios x {len(args.systems)} systems in {wall:.1f}s; wrote "
          + ", ".join(str(p) for p in written))
    return 0
