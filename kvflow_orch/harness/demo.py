"""What ``kvflow demo`` runs and checks: a software company working through a backlog of projects
on a fresh embedded engine per policy, the engine's cache counters, the brain's record of its calls,
the Bélády bound on those calls and the demo's targets. ``examples/metagpt_replay.py`` repeats
single runs under each policy with :func:`run_on_engine`.

Why this configuration shows what kvflow buys on a CPU: with no host tier an evicted prompt is
recomputed, and recomputing an 800-token role prompt costs a 135M model on two cores over a
second, where a call that finds its prompt cached and writes a short reply takes a fraction of
that. The device pool holds 90% of the five role prompts, so whenever a role runs another one's
prompt must go: LRU drops the role that ran longest ago, which in a pipeline that comes round again
is the next one to run; kvflow drops the role with the most steps to go.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, NamedTuple, Sequence

from backends.kvcache import CacheConfig
from backends.kvcache.trace import BrainRecorder, replay
from backends.local import Engine

from ..runtime import arun

__all__ = ["EngineRun", "run_on_engine", "compare_rows", "DEMO_IDEA", "DEMO_IDEAS", "STAT_KEYS", "BASELINE",
           "POOL_SHARE", "DemoPlan", "backlog", "role_prompt_tokens", "device_tokens_for", "check_device_tokens",
           "Bounds", "replay_bounds", "Target", "demo_targets", "TARGET_SPEEDUP", "TARGET_FEWER_RECOMPUTED",
           "TARGET_BELADY_GAP"]

DEMO_IDEA = "a command-line todo list that stores tasks in a local JSON file, with due dates and tags"
"""The first project of the demo's backlog (the single-project MetaGPT workflow's ``idea`` input)."""

DEMO_IDEAS = (
    DEMO_IDEA,
    "a web page that converts lengths, weights and temperatures between units",
    "a library that validates CSV files against a column schema and reports every bad row",
)
"""The built-in projects, in order: ``kvflow demo`` works through the first two by default (its time
target), ``examples/metagpt_replay.py`` through all three."""

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
"""The baseline's policy and prefetch: what a stock radix cache does."""

POOL_SHARE = 0.9
"""The demo's default device pool, as a share of the role prompts' tokens taken together."""

TARGET_SPEEDUP = 1.25
TARGET_FEWER_RECOMPUTED = 0.30
TARGET_BELADY_GAP = 0.05
"""The demo's targets: kvflow at least 1.25x faster than the baseline in wall time, at least 30%
fewer recomputed prompt tokens, and within 5% of Bélády's recomputed tokens on the same calls."""


class EngineRun(NamedTuple):
    result: Any
    """The :class:`~kvflow_orch.runtime.RunResult`."""
    stats: dict[str, Any]
    """``engine.stats()`` after the run."""
    seconds: float
    """Wall time of the workflow alone (engine start-up excluded)."""
    events: tuple[tuple[str, Any], ...] = ()
    """The brain calls of the run, in order (``record=True``), for :func:`replay_bounds`."""
    cache_config: CacheConfig | None = None
    """The brain's configuration the run used."""


async def run_on_engine(workflow: Any, inputs: dict[str, Any], config: Any, *, on_event: Callable | None = None,
                        record: bool = False) -> EngineRun:
    """Start an embedded engine from ``config``, run ``workflow`` on it once, stop the engine; with
    ``record`` keep the brain calls it made (:class:`~backends.kvcache.trace.BrainRecorder`)."""
    engine = Engine(config)
    recorder = BrainRecorder(engine.scheduler.cache) if record else None
    await engine.start()
    try:
        started = time.perf_counter()
        result = await arun(workflow, inputs, backend=engine, on_event=on_event)
        seconds = time.perf_counter() - started
        events = tuple(recorder.events) if recorder else ()
        return EngineRun(result, dict(engine.stats()), seconds, events, config.cache)
    finally:
        await engine.shutdown()


def compare_rows(runs: dict[str, EngineRun]) -> list[list[str]]:
    """The side-by-side table's rows (one column per run): tokens, cache counters, wall time."""
    def row(label: str, value: Callable[[EngineRun], Any]) -> list[str]:
        return [label, *(str(value(run)) for run in runs.values())]

    rows = [row("prompt tokens", prompt_tokens)]
    rows += [row(key, lambda r, key=key: r.stats.get(key, "n/a")) for key in STAT_KEYS]
    rows.append(row("wall time (s)", lambda r: f"{r.seconds:.1f}"))
    return rows


def prompt_tokens(run: EngineRun) -> int:
    s = run.stats
    return (s.get("device_hit_tokens", 0) + s.get("host_hit_tokens", 0) + s.get("prefetch_hit_tokens", 0)
            + s.get("recomputed_tokens", 0))


# ---- the workload ---------------------------------------------------------------------------

class DemoPlan(NamedTuple):
    workflow: Any
    inputs: dict[str, Any]
    calls: int
    """LLM calls one run makes (the progress line's total)."""


def backlog(ideas: Sequence[str], fix_rounds: int, max_tokens: int) -> DemoPlan:
    """The MetaGPT-style company working through ``ideas`` one project after another (one workflow:
    every role comes back once per project)."""
    from workflows.metagpt import metagpt

    if not ideas:
        raise ValueError("the backlog needs at least one idea")
    if any(not idea.strip() for idea in ideas):
        raise ValueError("an idea must not be empty")
    workflow = metagpt(fix_rounds=fix_rounds, max_tokens=max_tokens, backlog=True)
    per_project = 3 + 2 * (fix_rounds + 1)  # three planning roles, then Engineer and QA per round
    return DemoPlan(workflow, {"ideas": list(ideas)}, per_project * len(ideas))


def role_prompt_tokens(workflow: Any, model: str) -> dict[str, int]:
    """Tokens of each agent's fixed prompt (its system message as the model's chat template renders
    it) in ``model``'s tokenizer: what the device pool is sized against."""
    from backends.local.model.loader import read_source

    tokenizer = read_source(model)[2]  # the weights are opened lazily: reading the tokenizer is cheap
    asg = workflow.compile()
    return {agent: len(tokenizer.encode(tokenizer.render_chat([{"role": "system", "content": asg.system_prompt(agent)}],
                                                              add_generation_prompt=False)))
            for agent in asg.agents}


def device_tokens_for(role_tokens: dict[str, int], share: float = POOL_SHARE) -> int:
    return int(share * sum(role_tokens.values()))


def check_device_tokens(device_tokens: int, role_tokens: dict[str, int]) -> None:
    """Refuse a pool that cannot hold the largest role prompt (every call of that role would fail)."""
    agent, largest = max(role_tokens.items(), key=lambda item: item[1])
    if device_tokens <= largest:
        raise ValueError(f"--device-tokens {device_tokens:,} cannot hold the {agent} role's fixed prompt of "
                         f"{largest:,} tokens and a reply; give more than that")


# ---- bounds and targets ---------------------------------------------------------------------

class Bounds(NamedTuple):
    belady: int
    """Prompt tokens recomputed by Bélády's offline-optimal eviction order on the same brain calls."""
    replayed: int
    """The run's own policy replayed through a fresh brain (equal to the engine's counter when the
    replay follows the engine faithfully)."""
    floor: int
    """Prompt tokens any policy recomputes even with a pool that holds every call: the dynamic parts
    and the first use of each fixed prompt."""


def replay_bounds(run: EngineRun) -> Bounds | None:
    """Replay the recorded brain calls of ``run`` (no model: hits and evictions follow from token
    ids, hints and sizes); ``None`` when the run had a host tier (the replay covers device-only
    traces) or recorded nothing."""
    if not run.events or run.cache_config is None or run.cache_config.has_host_tier:
        return None
    config = run.cache_config
    belady = replay(run.events, config, belady=True).stats.recomputed_tokens
    unbounded = replace(config, device_tokens=sum(len(r.prompt) + r.decode_room for r in _requests(run.events)),
                        namespace_cap_tokens=None)
    return Bounds(belady, replay(run.events, config).stats.recomputed_tokens,
                  replay(run.events, unbounded).stats.recomputed_tokens)


def _requests(events: Sequence[tuple[str, Any]]) -> list[Any]:
    return [payload for kind, payload in events if kind == "request"]


class Target(NamedTuple):
    ok: bool
    text: str


def demo_targets(baseline: EngineRun, kvflow: EngineRun, bounds: Bounds | None, identical: bool) -> list[Target]:
    """The demo's targets, each with the figure measured on this run."""
    speedup = baseline.seconds / kvflow.seconds if kvflow.seconds else float("inf")
    base_re, kv_re = baseline.stats["recomputed_tokens"], kvflow.stats["recomputed_tokens"]
    fewer = 1 - kv_re / base_re if base_re else 0.0
    out = [Target(speedup >= TARGET_SPEEDUP, f"wall time: baseline / kvflow = {speedup:.2f}x "
                                            f"(target >= {TARGET_SPEEDUP:.2f}x)"),
           Target(fewer >= TARGET_FEWER_RECOMPUTED, f"recomputed prompt tokens: {fewer:.1%} fewer than the baseline "
                                                   f"(target >= {TARGET_FEWER_RECOMPUTED:.0%})")]
    if bounds is not None:
        gap = kv_re / bounds.belady - 1 if bounds.belady else 0.0
        out.append(Target(gap <= TARGET_BELADY_GAP, f"recomputed prompt tokens: kvflow {kv_re:,} vs Bélády "
                                                    f"{bounds.belady:,}, {gap:+.1%} (target within "
                                                    f"{TARGET_BELADY_GAP:.0%})"))
    out.append(Target(identical, "greedy outputs identical in both runs"))
    return out
