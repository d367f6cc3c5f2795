"""Bounds for the learned-routing engine benchmarks, measured on the run itself.

* Brain trace replays (``backends/kvcache/trace.py``) of a recorded run: with the run's own policy
  (must give the engine's counters back: the replay is faithful), with Bélády (the fewest tokens any
  eviction order recomputes on these requests), with the best online order A0 (every waiting worker
  at ``1 / p(worker)`` steps, the true routing probabilities: the optimal online demand-paging order
  when the router draws independently, as a supervisor's does) and into a pool that holds
  everything (the floor: dynamic parts and each prefix's first, cold use).
* Markov paging (``backends/sim/markov.py``) over the run's own agent sequence: the call-hit share
  of LRU, of expected steps and of the best online policy that knows the true transition matrix,
  beside Bélády's, for a pool of ``k`` prefixes.
"""

from __future__ import annotations

import math
import random
from typing import Mapping, Sequence

from backends.kvcache import CacheConfig
from backends.kvcache.trace import BrainRecorder, replay
from backends.sim.markov import MarkovChain, hit_rates

__all__ = ["brain_bounds", "a0_events", "markov_paging", "print_brain_bounds"]


def a0_events(events: list, probs: Mapping[str, float]) -> list:
    """The recorded events with every waiting worker's steps set to ``1 / p(worker)`` (the mean
    number of routing decisions until it is chosen): eviction then keeps the likeliest workers."""
    def rewrite(steps: dict[str, float]) -> dict[str, float]:
        return {a: (1 / probs[a] if a in probs and 0 < v < math.inf else v) for a, v in steps.items()}

    return [(kind, payload.model_copy(update={"steps": rewrite(payload.steps)})
             if kind in ("hint", "steps") else payload)
            for kind, payload in events]


def brain_bounds(recorders: Mapping[str, BrainRecorder], counters: Mapping[str, int], config: CacheConfig,
                 probs: Mapping[str, float]) -> dict:
    """Replays of recorded runs (name -> recorder; ``counters``: each run's recomputed tokens as the
    engine counted them) on ``config``: each run's own policy, then Bélády, A0 and the floor on the
    requests of the first run (every run sends the same prompts; Bélády is checked on each)."""
    out: dict = {"runs": {}}
    for name, rec in recorders.items():
        out["runs"][name] = {"engine": counters[name],
                             "replay": replay(rec.events, config).stats.recomputed_tokens,
                             "belady": replay(rec.events, config, belady=True).stats.recomputed_tokens}
    first = next(iter(recorders.values()))
    events = first.events
    out["belady"] = out["runs"][next(iter(recorders))]["belady"]
    out["a0"] = replay(a0_events(events, probs), config).stats.recomputed_tokens
    total = sum(len(r.prompt) + len(r.inserted or ()) for r in first.requests)
    room = total + config.device_tokens
    everything = CacheConfig(device_tokens=room, namespace_cap_tokens=room)
    out["floor"] = replay(events, everything).stats.recomputed_tokens
    out["faithful"] = all(r["engine"] == r["replay"] for r in out["runs"].values())
    return out


def print_brain_bounds(b: dict, base: str = "static") -> None:
    ref = max(1, b["runs"][base]["engine"])
    print("\nbounds on the same requests (the runs' brain calls replayed without the model):")
    checks = ", ".join(f"{n} {r['replay']} (engine {r['engine']})" for n, r in b["runs"].items())
    print(f"  replay check: {checks}: {'faithful' if b['faithful'] else 'NOT faithful'}")
    print(f"  {'':<30} {'recomputed':>11} {'/ ' + base:>10} {'avoidable':>10}")
    rows = [(f"{n} steps", r["engine"]) for n, r in b["runs"].items()]
    rows += [("best online (A0, true p)", b["a0"]), ("belady (offline optimal)", b["belady"]),
             ("floor (pool holds all)", b["floor"])]
    for label, v in rows:
        print(f"  {label:<30} {v:>11} {v / ref:>9.3f}x {v - b['floor']:>10}")
    other = {n: r["belady"] for n, r in b["runs"].items()}
    print(f"  (belady on each run's own requests: {other}; the same prompts, so they should match)")


def markov_paging(path: Sequence[str], probs: Mapping[str, float], hub: str, k: int, walk: int = 100_000) -> dict:
    """Call-hit shares of a supervisor loop (``hub`` calls worker ``w`` with ``probs[w]``, every
    worker hands back to ``hub``) for a pool of ``k`` prefixes: over ``path`` (the run's own
    calls) and over a long walk of the same chain."""
    names = (hub, *probs)
    total = sum(probs.values())
    rows = [tuple([0.0] + [probs[w] / total for w in probs])] + [tuple([1.0] + [0.0] * len(probs)) for _ in probs]
    chain = MarkovChain(names, tuple(rows))
    index = {n: i for i, n in enumerate(names)}
    own = hit_rates(chain, k, [[index[a] for a in path]])
    long = hit_rates(chain, k, [chain.walk(walk, random.Random(0))])
    return {"own": own, "long": long, "k": k}


def print_markov(m: dict) -> None:
    print(f"\nMarkov paging bound, pool of {m['k']} agent prefixes (call-hit share; backends/sim/markov.py):")
    print(f"  {'calls':<22} {'lru':>7} {'expected steps':>15} {'best online':>12} {'belady':>8}")
    for label, r in (("this run's path", m["own"]), (f"{m['long'].calls:,} calls", m["long"])):
        print(f"  {label:<22} {r.lru:>7.3f} {r.expected_steps:>15.3f} {r.best_online:>12.3f} {r.belady:>8.3f}")
