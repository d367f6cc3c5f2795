"""What learned routing adds to a tracker transition at 100 nodes (issue 26 target: <= 0.1 ms).

    flock /tmp/kvflow-timing.lock python benchmarks/learned_overhead.py [--transitions 20000]

Two 100-agent graphs, each driven through the same transitions twice in one run, static and learned
(fresh ``BranchStats``, every routing decision observed as it is made, the tables following them):

* ``loop``: the paper's sequential workflow (``workflows.synthetic``, 100 stages); the last stage
  routes back to the first or ends, so a decision comes every 100 transitions;
* ``supervisor``: ``workflows.supervisor`` with 99 workers (Zipf(1.2) routing), a decision every
  other transition, 100 targets to learn: the densest case.

A transition is one ``finish`` plus one ``start`` and the hint every driver builds
(``WorkflowHints.hint``: ``agent_steps()`` of all agents); static and learned step in lockstep, one
transition each in turn, so a busy machine's noise falls on both alike. The figure the target applies to is the
mean learned-minus-static time per transition over the whole run, every solve and rank-one update
included (the tables' work is budgeted per transition, so the mean is what the budget bounds);
p99 and max show where the solves land.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvflow_orch import END, START, BranchStats
from kvflow_orch.asg import ExpectedTables
from kvflow_orch.hinting import WorkflowHints
from kvflow_orch.stepmath import solve, solve_ops
from workflows.supervisor import routing, supervisor
from workflows.synthetic import synthetic

TARGET_MS = 0.1


def loop_graph():
    asg = synthetic(n_agents=100, fixed=8, dynamic=4, output=4, rounds=1).compile()
    names = list(asg.nodes)

    def choose(node: str, rng: random.Random) -> str | None:
        if node != names[-1]:
            return None
        return END if rng.random() < 0.02 else names[0]

    return asg, choose, names[-1]


def supervisor_graph():
    asg = supervisor(workers=99, zipf_s=1.2, fixed=8).compile()
    weights = routing(99, 1.2)["supervisor"]
    workers, w = list(weights), list(weights.values())

    def choose(node: str, rng: random.Random) -> str | None:
        if node != "supervisor":
            return None
        return END if rng.random() < 0.01 else rng.choices(workers, w)[0]

    return asg, choose, "supervisor"


class Walker:
    """Follows the graph's single token through one tracker (fresh when the run ends)."""

    def __init__(self, asg, choose, stats: BranchStats | None, seed: int) -> None:
        self.asg, self.choose, self.stats = asg, choose, stats
        self.rng = random.Random(seed)  # the same seed: static and learned take the same path
        self.hints = WorkflowHints("bench", "bench")
        self.tracker = self._fresh()
        self.node = min(self.tracker.triggered)
        self.tracker.start(self.node)

    def _fresh(self):
        tr = self.asg.tracker(self.stats)
        if tr.running.get(START):
            tr.finish(START, goto=None)
        return tr

    def step(self) -> float:
        """One transition (finish, start, hint) in ms."""
        t = time.perf_counter()
        goto = self.choose(self.node, self.rng)
        if goto is not None and self.stats is not None:
            self.stats.observe(self.asg.name, self.node, goto)
        self.tracker.finish(self.node, goto=goto)
        if self.tracker.done:
            self.tracker = self._fresh()
        self.node = min(self.tracker.triggered)
        self.tracker.start(self.node)
        self.hints.hint(self.tracker, self.asg.agent_of(self.node), fixed_prefix=1)
        return (time.perf_counter() - t) * 1e3


def drive(asg, choose, transitions: int) -> tuple[list[float], list[float], BranchStats]:
    """Static and learned in lockstep (one transition each, alternately), so the machine's noise
    falls on both alike."""
    stats = BranchStats()
    static, learned = Walker(asg, choose, None, 0), Walker(asg, choose, stats, 0)
    a, b = [], []
    for _ in range(transitions):
        a.append(static.step())
        b.append(learned.step())
    return a, b, stats


def ns_per_op(size: int) -> float:
    """Measured time of one multiply-add of the solver (a full chain solve on ``size`` states)."""
    rows = [{(u + 1) % size: 0.9} for u in range(size)]
    outcomes = [[r] for r in rows]
    t = time.perf_counter()
    solve(outcomes)
    return (time.perf_counter() - t) * 1e9 / solve_ops(outcomes)


def row(name: str, samples: list[float]) -> str:
    s = sorted(samples)
    return (f"{name:<26} {statistics.fmean(s):9.4f} {s[len(s) // 2]:9.4f} {s[int(len(s) * 0.99)]:9.4f} "
            f"{s[-1]:9.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transitions", type=int, default=20_000)
    args = p.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"uptime: {load}")
    op = ns_per_op(101)
    budget = ExpectedTables.budget_ops
    print(f"solver: {op:.0f} ns per multiply-add (a 101-state chain solve); budget {budget} multiply-adds "
          f"per transition = {budget * op / 1e6:.3f} ms\n")
    print(f"{'graph / steps':<26} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    verdicts = []
    for name, build in (("loop", loop_graph), ("supervisor", supervisor_graph)):
        asg, choose, router = build()
        static, learned, stats = drive(asg, choose, args.transitions)
        tables = asg.expected_tables(stats)
        print(row(f"{name} static", static))
        print(row(f"{name} learned", learned))
        extra = statistics.fmean(learned) - statistics.fmean(static)
        print(f"{'':<26} {len(asg.nodes)} nodes, {args.transitions} transitions, "
              f"{stats.decisions(asg.name, router):g} decisions, "
              f"{tables.solves} solves, {tables.updates} rank-one updates")
        verdicts.append((name, extra))
    print()
    for name, extra in verdicts:
        print(f"  {'PASS' if extra <= TARGET_MS else 'FAIL'}  {name}: learned adds {extra:.4f} ms per transition "
              f"(mean over the run, solves included; target <= {TARGET_MS} ms)")
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
