"""What ``kvflow demo`` prints after its runs: both runs side by side, the Bélády bound on the same
calls, the simulator's projection of those calls onto the paper's GPU profiles, the targets with
this run's figures, and the files it wrote (the PNG timeline, the recorded calls)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO, Mapping

from backends.kvcache import CacheConfig
from kvflow_orch.protocol import write_calls

from .console import print_table
from .demo import EngineRun, compare_rows, demo_targets, prompt_tokens, replay_bounds
from .projection import PROJECTED_SYSTEMS, project_trace
from .timeline import write_timeline

__all__ = ["report", "print_intro", "run_label", "TIMELINE_NAME", "CALLS_NAME"]

TIMELINE_NAME = "timeline.png"
CALLS_NAME = "kvflow-calls.jsonl"


def run_label(name: str, cache: CacheConfig) -> str:
    """``baseline (lru)``, ``kvflow (kvflow, prefetch)``: a run's name and what its cache does."""
    extra = ", prefetch" if cache.prefetch and cache.has_host_tier else ""
    return f"{name} ({cache.policy}{extra})"


def print_intro(model: str, projects: int, fix_rounds: int, max_tokens: int, calls: int, roles: Mapping[str, int],
                device_tokens: int, host_tokens: int, stream: IO[str] | None = None) -> None:
    """What the demo is about to run, on what machine (CPUs and load: a wall time needs both)."""
    stream = stream or sys.stdout
    fixed = sum(roles.values())
    host = f"a {host_tokens:,}-token host tier" if host_tokens else "no host tier (an evicted prompt is recomputed)"
    print(f"kvflow demo: a MetaGPT-style software company ({len(roles)} roles, fixed prompts of "
          f"{min(roles.values()):,}-{max(roles.values()):,} tokens) works through {projects} project(s) with "
          f"{fix_rounds} fix round(s) each: {calls} LLM calls, replies of at most {max_tokens} tokens.", file=stream)
    print(f"Model {model} on the embedded engine, this machine ({os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}). Device pool {device_tokens:,} tokens = {device_tokens / fixed:.0%} of the role "
          f"prompts' {fixed:,}; {host}.\n", file=stream, flush=True)


def report(runs: Mapping[str, EngineRun], labels: Mapping[str, str], device_tokens: int, out: Path, *,
           fancy: bool | None = None, stream: IO[str] | None = None) -> int:
    """Print the comparison of ``runs`` (``"baseline"`` optional, ``"kvflow"`` always) and write the
    files under ``out``; returns the command's exit status (0: the runs completed, whatever the
    targets say; they are figures of one machine, printed, not enforced)."""
    stream = stream or sys.stdout
    kvflow = runs["kvflow"]
    baseline = runs.get("baseline")
    print(file=stream)
    print_table("Both runs on the same calls (prompt tokens; wall time of the workflow, engine start excluded)",
                ("", *(labels[name] for name in runs)), compare_rows(runs), stream, fancy=fancy)
    identical = baseline is not None and baseline.result.state == kvflow.result.state
    if baseline is not None:
        print(f"greedy outputs identical in both runs: {'yes' if identical else 'NO'}", file=stream)
    bounds = replay_bounds(kvflow)
    if bounds is not None:
        print(f"Bélády (offline optimum, the brain's replay of the kvflow run's calls): {bounds.belady:,} "
              f"prompt tokens recomputed; any policy with an unbounded pool: {bounds.floor:,} "
              f"(the dynamic parts and each prompt's first use); kvflow's own policy replayed: {bounds.replayed:,}",
              file=stream)
    out.mkdir(parents=True, exist_ok=True)
    calls_path = out / CALLS_NAME
    with open(calls_path, "w", encoding="utf-8") as f:
        write_calls(kvflow.result.calls, f)
    _print_projection(calls_path, device_tokens, stream, fancy)
    if baseline is not None:
        print("\nTargets (this run, this machine):", file=stream)
        for target in demo_targets(baseline, kvflow, bounds, identical):
            print(f"  [{'ok' if target.ok else 'MISSED'}] {target.text}", file=stream)
    try:
        timeline = write_timeline({labels[name]: run.result.calls for name, run in runs.items()}, out / TIMELINE_NAME,
                                  title=f"LLM calls per agent, device pool {device_tokens:,} tokens "
                                        f"({prompt_tokens(kvflow):,} prompt tokens per run)")
        print(f"\nTimeline of the calls per agent: {timeline}", file=stream)
    except ImportError:  # matplotlib is the bench extra: a plain install still gets every figure above
        print("\nNo timeline PNG: matplotlib is not installed (pip install 'kvflow[bench]')", file=stream)
    print(f"The kvflow run's calls: {calls_path} (kvflow bench replay {calls_path} replays them)", file=stream)
    return 0


def _print_projection(calls_path: Path, device_tokens: int, stream: IO[str], fancy: bool | None) -> None:
    projections = project_trace(calls_path, device_tokens)
    names = [name for name, _ in PROJECTED_SYSTEMS]
    rows = [[p.label, *(f"{p.seconds[n]:.2f}" for n in names),
             f"{p.speedup('lru', 'kvflow'):.2f}x", f"{p.speedup('hicache', 'kvflow+host'):.2f}x"] for p in projections]
    print(file=stream)
    print_table("SIMULATED, not measured: the kvflow run's calls replayed by the simulator on the paper's GPU "
                f"profiles, same {device_tokens:,}-token pool (workflow seconds)",
                ("profile", *names, "kvflow vs lru", "kvflow+host vs hicache"), rows, stream, fancy=fancy)
