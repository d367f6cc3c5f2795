"""Where kvflow with continuations evicts otherwise than Bélády, on one matrix cell's run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/results/react-tools/slow-gap/eviction_choices.py \\
        [--agents 16] [--slow-share 1.0] [--seed 0]

The run is done twice: once to record its schedule, once more (the same simulated run, checked:
the same recomputed tokens) with an observer at each eviction that knows, from the recorded
admissions, when every evictable node is used next (Bélády's key on that schedule). At each
eviction, the tokens Bélády would have taken are the candidates used farthest ahead, as many as
the eviction took; the victims outside them are *misses of the order*, counted by what they were:

* ``paused``: a paused agent's conversation (its continuation, not yet returned), ``paused+fixed``
  its first tokens, which are also its agent's fixed prefix;
* ``running``: a returned conversation or the fixed prompt of an agent that runs now (0 steps);
* ``fixed``: another fixed prompt (a finished job's, or of an agent the hints put further);
* ``untagged``: a dynamic suffix no continuation holds.

For the paused victims, it also says how often the conversation Bélády would have taken instead
was the younger pause (the older one is sooner back in expectation: ``remaining_s``), and how
often the victim had outlasted every observed pause of its tool (the overdue rule) or none was
observed yet (cold).
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import replace
from pathlib import Path

import backends.sim.react as react
from backends.kvcache import CacheConfig
from backends.kvcache.policy import BeladyPolicy
from backends.kvcache.trace import replay_schedule
from backends.sim import CostModel, get_system, load_hardware, load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
from react_tools import pool_for, sim_spec

CONTINUATION = "~continuation/"


def observe(sim, future, log):
    """Wrap ``sim``'s brain: an oracle that follows its admissions, a log of each eviction."""
    cache = sim.cache
    oracle = BeladyPolicy(future)
    on_request, evict_nodes = cache.policy.on_request, cache._evict_nodes
    kept = cache.intake.continuations

    def continuation_of(node):
        return next((c for c in kept._kept.values() if node.tags and c.ref in node.tags), None)

    def kind(node):
        tags = node.tags or set()
        if not tags:
            return "untagged"
        c = continuation_of(node)
        fixed = any(not agent.startswith(CONTINUATION) for _, agent in tags)
        if c is not None and not c.returned:
            return "paused+fixed" if fixed else "paused"
        if c is not None or any(cache.hints.steps(ref) == 0 for ref in tags if not ref[1].startswith(CONTINUATION)):
            return "running"
        return "fixed"

    def describe(node):
        c = continuation_of(node)
        elapsed = None if c is None else cache.intake.clock() - c.paused_at
        state = None
        if c is not None:
            state = "cold" if not c.samples else "overdue" if elapsed >= c.samples[-1] else "within"
        return {"tokens": len(node), "next": -oracle.key(node)[0], "kind": kind(node), "elapsed": elapsed,
                "state": state}

    def on_admit(tokens):
        oracle.on_request(tokens)
        on_request(tokens)

    def on_evict(victims):
        chosen = set(victims)
        candidates = [n for n in cache._device_leaves if n.lock_ref == 0 and n not in chosen]
        log.append(([describe(v) for v in victims], [describe(c) for c in candidates]))
        return evict_nodes(victims)

    cache.policy.on_request, cache._evict_nodes = on_admit, on_evict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--slow-share", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", action="store_true", help="print each paused victim older than Bélády's choice")
    args = parser.parse_args()
    plans = react.react_plan(sim_spec(argparse.Namespace(turns=6), args.agents, args.slow_share, args.seed))
    cost = CostModel(load_hardware("a10g"), load_model("llama-3.1-8b"))
    system = get_system("gpu-only")
    pool = pool_for(plans, 0.45)
    config = CacheConfig(device_tokens=pool, policy="kvflow", continuations=True, prefetch=False,
                         namespace_cap_tokens=pool)
    first = react.run_react(plans, system, cost, config)
    future = [e[2] for e in first.schedule if e[0] == "admit"]
    belady = replay_schedule(first.schedule, replace(config, policy="lru", continuations=False), belady=True)
    log: list = []
    serving_sim = react.ServingSim

    def observed_sim(*a, **kw):
        sim = serving_sim(*a, **kw)
        observe(sim, future, log)
        return sim

    react.ServingSim = observed_sim
    try:
        again = react.run_react(plans, system, cost, config)
    finally:
        react.ServingSim = serving_sim
    assert again.recomputed_tokens == first.recomputed_tokens, "the observed run is not the recorded one"
    evicted, missed, instead = collections.Counter(), collections.Counter(), collections.Counter()
    younger = older = 0
    states = collections.Counter()
    for victims, candidates in log:
        need = sum(v["tokens"] for v in victims)
        ranked = sorted(victims + candidates, key=lambda d: -d["next"])
        oracle_ids, taken = set(), 0
        for d in ranked:
            if taken >= need:
                break
            oracle_ids.add(id(d))
            taken += d["tokens"]
        for v in victims:
            evicted[v["kind"]] += v["tokens"]
            if id(v) not in oracle_ids:
                missed[v["kind"]] += v["tokens"]
                states[v["state"]] += v["tokens"]
                for c in candidates:
                    if id(c) in oracle_ids and c["elapsed"] is not None and v["elapsed"] is not None:
                        if c["elapsed"] < v["elapsed"]:
                            younger += 1
                            if args.v:
                                print("evicted", v, "\n  where Bélády evicts", c)
                        else:
                            older += 1
        for c in candidates:
            if id(c) in oracle_ids:
                instead[c["kind"]] += c["tokens"]
    print(f"{args.agents} agents, slow share {args.slow_share}, seed {args.seed}: "
          f"recomputed {first.recomputed_tokens}, Bélády on its schedule {belady.stats.recomputed_tokens} "
          f"({first.recomputed_tokens / belady.stats.recomputed_tokens:.3f}x); {len(log)} evictions; "
          f"continuations {first.counters}")
    print("evicted tokens by kind:", dict(evicted))
    print("misses of the order (evicted, Bélády would have kept), by kind:", dict(missed))
    print("  by the victim's estimate (within the observed pauses / overdue / cold):", dict(states))
    print("what Bélády would have evicted instead, by kind:", dict(instead))
    print(f"  pairs (paused victim, paused conversation Bélády would have evicted instead): the latter the younger "
          f"pause {younger}, the older {older}")


if __name__ == "__main__":
    main()
