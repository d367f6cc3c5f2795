"""Time one ``finish()`` + ``steps()`` update of the StepTracker on generated workflows.

Workflows of 10, 100, 1,000 and 10,000 nodes repeat a five-node motif with an AND-join inside a
cycle: ``split -> {a, b, c}``, ``[a, b, c] -> merge``, ``merge -> {split (retry), next split,
a random earlier split}``. A random valid execution (seeded) starts triggered nodes and finishes
running ones; each finish with its following ``steps()`` is timed. Targets: under 1 ms
at 100 nodes and under 10 ms at 1,000, judged on the p99.

    python benchmarks/asg_steps.py [--updates 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import NamedTuple

from kvflow_orch import END, START, AgentStepGraph, Workflow

SIZES = (10, 100, 1_000, 10_000)
TARGET_MS = {100: 1.0, 1_000: 10.0}
MOTIF = ("split", "a", "b", "c", "merge")


class Result(NamedTuple):
    nodes: int
    edges: int
    updates: int
    median_ms: float
    p99_ms: float


def generate(size: int, rng: random.Random) -> AgentStepGraph:
    """``size // 5`` motifs chained by conditional edges, with retries and random back edges."""
    wf = Workflow(f"generated-{size}")
    blocks = max(1, size // len(MOTIF))
    for b in range(blocks):
        for part in MOTIF:
            wf.add_agent(f"{part}{b}", system=f"role {part} {b % 50}", agent=f"{part}-{b % 50}")
    wf.add_edge(START, "split0")
    for b in range(blocks):
        for worker in "abc":
            wf.add_edge(f"split{b}", f"{worker}{b}")
        wf.add_edge([f"a{b}", f"b{b}", f"c{b}"], f"merge{b}")
        forward = f"split{b + 1}" if b + 1 < blocks else END
        back = f"split{rng.randrange(b + 1)}"
        wf.add_conditional_edges(f"merge{b}", _route, {"retry": f"split{b}", "next": forward, "back": back})
    return wf.compile()


def _route(state):
    return "next"


def run_updates(asg: AgentStepGraph, updates: int, rng: random.Random) -> list[float]:
    """Times (seconds) of ``finish()`` + ``steps()`` over a random valid execution."""
    tracker = asg.tracker()
    running: list[str] = []
    timings: list[float] = []
    clock = time.perf_counter
    while len(timings) < updates:
        if tracker.done:
            tracker = asg.tracker()
        triggered = sorted(tracker.triggered)
        if triggered and (not running or rng.random() < 0.5):
            node = rng.choice(triggered)
            tracker.start(node)
            running.append(node)
            continue
        node = running.pop(rng.randrange(len(running)))
        goto = _choose(asg, node, rng)
        began = clock()
        tracker.finish(node, goto)
        tracker.steps()
        timings.append(clock() - began)
    return timings


def _choose(asg: AgentStepGraph, node: str, rng: random.Random) -> str | None:
    branches = asg.branches_of(node)
    if not branches:
        return None
    path_map = branches[0].path_map
    key = rng.choices(("next", "retry", "back"), weights=(0.6, 0.25, 0.15))[0]
    return path_map[key]


def measure(size: int, updates: int, seed: int) -> Result:
    rng = random.Random(seed)
    asg = generate(size, rng)
    graph = asg.to_networkx()
    timings = sorted(run_updates(asg, updates, rng))
    p99 = timings[min(len(timings) - 1, int(0.99 * len(timings)))]
    return Result(len(asg.nodes), graph.number_of_edges(), len(timings), statistics.median(timings) * 1e3, p99 * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2000, help="timed updates per size (10,000 nodes: a tenth)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'nodes':>7} {'edges':>7} {'updates':>8} {'median ms':>10} {'p99 ms':>9} {'target':>8}  met")
    all_met = True
    for size in SIZES:
        updates = args.updates if size < 10_000 else max(50, args.updates // 10)
        r = measure(size, updates, args.seed)
        target = TARGET_MS.get(size)
        met = "-" if target is None else ("yes" if r.p99_ms < target else "NO")
        all_met &= met != "NO"
        shown = f"<{target:g} ms" if target else "-"
        print(f"{r.nodes:>7} {r.edges:>7} {r.updates:>8} {r.median_ms:>10.3f} {r.p99_ms:>9.3f} {shown:>8}  {met}")
    print("all targets met" if all_met else "some targets missed")


if __name__ == "__main__":
    main()
