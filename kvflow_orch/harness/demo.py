"""One workflow on a fresh embedded engine, with the engine's cache counters: what ``kvflow demo``
runs twice (baseline, then kvflow) and ``examples/metagpt_replay.py`` repeats under each policy."""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from backends.local import Engine

from ..runtime import arun

__all__ = ["EngineRun", "run_on_engine", "compare_rows", "DEMO_IDEA", "STAT_KEYS", "BASELINE"]

DEMO_IDEA = "a command-line todo list that stores tasks in a local JSON file, with due dates and tags"
"""What the demo's software company builds (the MetaGPT workflow's ``idea`` input)."""

STAT_KEYS = (
    "device_hit_tokens",
    "host_hit_tokens",
    "prefetch_hit_tokens",
    "recomputed_tokens",
    "prefetched_tokens",
    "evicted_device_tokens",
)
"""The engine counters the side-by-side tables show, in order."""

BASELINE = ("lru", False)
"""The baseline's policy and prefetch: what a stock radix cache with a host tier does."""


class EngineRun(NamedTuple):
    result: Any
    """The :class:`~kvflow_orch.runtime.RunResult`."""
    stats: dict[str, Any]
    """``engine.stats()`` after the run."""
    seconds: float
    """Wall time of the workflow alone (engine start-up excluded)."""


async def run_on_engine(workflow: Any, inputs: dict[str, Any], config: Any, *,
                        on_event: Callable | None = None) -> EngineRun:
    """Start an embedded engine from ``config``, run ``workflow`` on it once, stop the engine."""
    engine = Engine(config)
    await engine.start()
    try:
        started = time.perf_counter()
        result = await arun(workflow, inputs, backend=engine, on_event=on_event)
        seconds = time.perf_counter() - started
        return EngineRun(result, dict(engine.stats()), seconds)
    finally:
        await engine.shutdown()


def compare_rows(runs: dict[str, EngineRun]) -> list[list[str]]:
    """The side-by-side table's rows (one column per run): tokens, cache counters, wall time."""
    def row(label: str, value: Callable[[EngineRun], Any]) -> list[str]:
        return [label, *(str(value(run)) for run in runs.values())]

    rows = [row("prompt tokens", lambda r: r.stats.get("device_hit_tokens", 0) + r.stats.get("host_hit_tokens", 0)
                + r.stats.get("prefetch_hit_tokens", 0) + r.stats.get("recomputed_tokens", 0))]
    rows += [row(key, lambda r, key=key: r.stats.get(key, "n/a")) for key in STAT_KEYS]
    rows.append(row("wall time (s)", lambda r: f"{r.seconds:.1f}"))
    return rows
