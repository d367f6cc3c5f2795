"""Cache-brain benchmarks: op cost on a large tree, and policy quality on traces.

1. **Op cost.** Build a radix tree of ~100k nodes from generated requests (each one a random
   prefix of an earlier request plus 8 fresh tokens, at most 128 tokens), then time 10k mixed ops:
   ``match`` (match_prefix), ``insert`` (match, allocate the uncached tail, insert; evicting as
   needed) and ``evict`` (evict_device(64)). ``lru`` runs without hints; ``kvflow`` also tags an
   agent's fixed prefix on every insert and applies a steps update for 100 agents every 100 ops.
   The same ops also run on SGLang's own ``RadixCache`` (:func:`sglang_op_cost`, simulated mode,
   LRU) where sglang is importable (``.venv-sglang``); skipped otherwise.
2. **Policy quality.** Token-level replay (no model) of the paper's synthetic sequential workflow
   (10 agents, fixed 4096 / dynamic 32 / output 32, 10 rounds) and a cyclic MetaGPT-style trace
   (5 roles in a ring, fixed 2k-4k tokens sharing a 256-token preamble, 10 rounds), with a device
   pool for 30/50/70% of all fixed prompts and a host tier holding everything. Prints the share of
   fixed-prompt tokens found on device at admission, per policy (lru, kvflow, belady), without
   prefetch (eviction quality alone); kvflow again with the workflow's first steps known before
   the hint-less warm-up (isolates the warm-up transient); and kvflow with prefetch.

    python benchmarks/kvcache_ops.py [--nodes 100000] [--ops 10000] [--seed 0] [--skip-ops] [--skip-quality]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from typing import NamedTuple, Sequence

from backends.kvcache import BeladyPolicy, CacheConfig, KVCache
from kvflow_orch.protocol import StepsUpdate

# ---------------------------------------------------------------------------------------------
# 1. Op cost
# ---------------------------------------------------------------------------------------------


class OpWorkload(NamedTuple):
    build: list[tuple[int, ...]]          # requests inserted before timing
    ops: list[tuple[str, object]]         # ("match", tokens) | ("insert", tokens) | ("evict", n)
    device_tokens: int
    agents: int                           # request i belongs to agent i % agents ...
    fixed: int                            # ... whose fixed prefix is its first `fixed` tokens


def make_op_workload(nodes: int, ops: int, seed: int, agents: int = 100, fixed: int = 32) -> OpWorkload:
    """Requests of ``agents`` agents, each a random prefix (at least the agent's fixed prefix) of
    an earlier request of the same agent plus 8 fresh tokens; about 1.55 radix nodes per request."""
    rng = random.Random(seed)
    fresh = iter(range(1, 1 << 62))
    per_agent: list[list[tuple[int, ...]]] = [[tuple(next(fresh) for _ in range(fixed))] for _ in range(agents)]
    seqs: list[tuple[int, ...]] = []

    def new_request() -> tuple[int, ...]:
        mine = per_agent[len(seqs) % agents]
        base = rng.choice(mine)
        cut = rng.randint(fixed, max(fixed, min(len(base), 120)))
        seq = base[:cut] + tuple(next(fresh) for _ in range(8))
        mine.append(seq)
        return seq

    while len(seqs) < int(nodes / 1.55):
        seqs.append(new_request())
    build = list(seqs)
    mixed: list[tuple[str, object]] = []
    for _ in range(ops):
        r = rng.random()
        if r < 0.45:
            mixed.append(("match", rng.choice(seqs)[: rng.randint(1, 128)]))
        elif r < 0.9:
            seqs.append(new_request())
            mixed.append(("insert", seqs[-1]))
        else:
            mixed.append(("evict", 64))
    # Room for the whole build (every distinct token) plus a little: timed inserts must evict.
    device = agents * fixed + 8 * len(build) + 2048
    return OpWorkload(build, mixed, device, agents, fixed)


def _insert(cache: KVCache, tokens: Sequence[int], agent=None, fixed=None) -> None:
    m = cache.match_prefix(tokens)
    alloc = cache.alloc_device(len(tokens) - m.device_tokens)
    if alloc.slots is None:
        return
    cache.insert(tokens, m.device_slots + alloc.slots, agent=agent, fixed_prefix_tokens=fixed)


def ours_op_cost(policy: str, work: OpWorkload, seed: int) -> dict[str, float]:
    """Mean microseconds per op kind for our KVCache; plus the tree size."""
    rng = random.Random(seed)
    hinted = policy == "kvflow"
    cache = KVCache(CacheConfig(device_tokens=work.device_tokens, policy=policy, prefetch=False))
    for i, seq in enumerate(work.build):
        _insert(cache, seq, *((("ns", f"agent{i % work.agents}"), work.fixed) if hinted else ()))
    size = len(cache.tree)
    spent: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    inserted = 0
    for i, (kind, arg) in enumerate(work.ops):
        if hinted and i % 100 == 0:
            steps = {f"agent{a}": rng.choice([None, 0, 1, 2, 3, 5, 8]) for a in range(work.agents)}
            t0 = time.perf_counter()
            cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps=steps))
            spent["steps"] += time.perf_counter() - t0
            count["steps"] += 1
        t0 = time.perf_counter()
        if kind == "match":
            cache.match_prefix(arg)
        elif kind == "insert":
            _insert(cache, arg, *((("ns", f"agent{(len(work.build) + inserted) % work.agents}"), work.fixed)
                                  if hinted else ()))
            inserted += 1
        else:
            cache.evict_device(arg)
        spent[kind] += time.perf_counter() - t0
        count[kind] += 1
    out = {k: 1e6 * spent[k] / count[k] for k in spent}
    out["total_s"] = sum(spent.values())
    out["nodes"] = size
    return out


def sglang_op_cost(work: OpWorkload) -> dict[str, float] | None:
    """Replay ``work`` on SGLang's own legacy ``RadixCache`` in
    simulated mode (the scheduler's in-batch tree; no KV pools) with LRU, and return the same keys
    as :func:`ours_op_cost`; ``None`` when sglang is not importable (skipped).

    Same op semantics: ``match`` = match_prefix; ``insert`` = match_prefix, evict LRU leaves when
    the ``work.device_tokens`` budget is short for the uncached tail, insert; ``evict`` = evict 64.
    Values are the token ids themselves (simulated mode), so no allocator work is timed on either
    side beyond its own bookkeeping.
    """
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return None
    from backends.sglang_kvflow.cpu_shims import install_import_shims

    install_import_shims()  # CPU torch + the CUDA-only torchvision wheel (no-op on a GPU build)
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    class _NoPool:  # simulated mode: evicted values are token ids, nothing to give back
        device = "cpu"

        def free(self, *_: object, **__: object) -> None:
            pass

        free_segment = free

    cache = RadixCache.create_simulated(mock_allocator=_NoPool())

    def insert(tokens: Sequence[int]) -> None:
        key = RadixKey(list(tokens))
        cached = cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
        short = cache.evictable_size() + cache.protected_size() + len(tokens) - cached - work.device_tokens
        if short > 0:
            cache.evict(EvictParams(num_tokens=short))
        cache.insert(InsertParams(key=key, value=None))

    for seq in work.build:
        insert(seq)
    size = 0
    stack = [cache.root_node]
    while stack:
        node = stack.pop()
        size += 1
        stack.extend(node.children.values())
    spent: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for kind, arg in work.ops:
        t0 = time.perf_counter()
        if kind == "match":
            cache.match_prefix(MatchPrefixParams(key=RadixKey(list(arg))))
        elif kind == "insert":
            insert(arg)
        else:
            cache.evict(EvictParams(num_tokens=arg))
        spent[kind] += time.perf_counter() - t0
        count[kind] += 1
    out = {k: 1e6 * spent[k] / count[k] for k in spent}
    out["total_s"] = sum(spent.values())
    out["nodes"] = size - 1  # without the root, as len(KVCache.tree)
    return out


def run_op_cost(args: argparse.Namespace) -> None:
    work = make_op_workload(args.nodes, args.ops, args.seed)
    print(f"== op cost: {len(work.build)} build requests, {len(work.ops)} mixed ops, "
          f"device pool {work.device_tokens} tokens")
    rows = {policy: ours_op_cost(policy, work, args.seed) for policy in ("lru", "kvflow")}
    sglang = sglang_op_cost(work)
    if sglang is not None:
        rows["sglang-RadixCache"] = sglang
    kinds = ["match", "insert", "evict", "steps"]
    print(f"{'impl':<20}{'nodes':>8}" + "".join(f"{k + ' us':>12}" for k in kinds) + f"{'total s':>10}")
    for name, row in rows.items():
        cells = "".join(f"{row[k]:>12.1f}" if k in row else f"{'-':>12}" for k in kinds)
        print(f"{name:<20}{int(row['nodes']):>8}{cells}{row['total_s']:>10.2f}")
    print(f"ratio kvflow/lru total: {rows['kvflow']['total_s'] / rows['lru']['total_s']:.2f}")
    if sglang is None:
        print("sglang not importable here: SGLang RadixCache comparison skipped (run with .venv-sglang)")
    else:
        per_op = ", ".join(f"{k} {rows['lru'][k] / sglang[k]:.3g}" for k in ("match", "insert", "evict")
                           if k in sglang and sglang[k])
        print(f"ratio ours(lru)/SGLang total: {rows['lru']['total_s'] / sglang['total_s']:.3g} "
              f"(target <= 1.5); per op: {per_op}")


# ---------------------------------------------------------------------------------------------
# 2. Policy quality on traces
# ---------------------------------------------------------------------------------------------


class Request(NamedTuple):
    agent: str
    fixed: tuple[int, ...]
    dynamic: tuple[int, ...]
    output: tuple[int, ...]
    steps: dict[str, int]      # what the orchestrator sends with this request

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.fixed + self.dynamic


class Trace(NamedTuple):
    name: str
    agents: dict[str, tuple[int, ...]]   # fixed prompt per agent (warm-up order)
    requests: list[Request]


def _ring_steps(order: Sequence[str], current: int) -> dict[str, int]:
    """Steps-to-execution in a ring: distance to each agent's next turn (0 = running now)."""
    n = len(order)
    return {agent: (i - current) % n for i, agent in enumerate(order)}


def _ring_trace(name: str, fixed: dict[str, tuple[int, ...]], rounds: int, dyn: int, out: int,
                fresh) -> Trace:
    order = list(fixed)
    reqs = []
    for _ in range(rounds):
        for i, agent in enumerate(order):
            reqs.append(Request(agent, fixed[agent], tuple(next(fresh) for _ in range(dyn)),
                                tuple(next(fresh) for _ in range(out)), _ring_steps(order, i)))
    return Trace(name, fixed, reqs)


def synthetic_trace(agents: int = 10, fixed: int = 4096, dyn: int = 32, out: int = 32,
                    rounds: int = 10) -> Trace:
    """The paper's sequential workflow; rounds follow each other, so after the last agent the
    first one is next (steps are distances around that loop)."""
    fresh = iter(range(1, 1 << 62))
    prompts = {f"agent{i}": tuple(next(fresh) for _ in range(fixed)) for i in range(agents)}
    return _ring_trace("synthetic-seq-10x4096", prompts, rounds, dyn, out, fresh)


def metagpt_trace(rounds: int = 10) -> Trace:
    """MetaGPT-style roles in a cycle (each project hands over to the next one), with a shared
    256-token company preamble."""
    fresh = iter(range(1, 1 << 62))
    preamble = tuple(next(fresh) for _ in range(256))
    sizes = {"product_manager": 3072, "architect": 4096, "project_manager": 2048,
             "engineer": 4096, "qa_engineer": 3072}
    prompts = {role: preamble + tuple(next(fresh) for _ in range(n - 256)) for role, n in sizes.items()}
    return _ring_trace("metagpt-cycle-5roles", prompts, rounds, 64, 128, fresh)


def replay(trace: Trace, policy: str, device_tokens: int, host_tokens: int, prefetch: bool,
           hinted_warmup: bool = False) -> float:
    """Share of fixed-prompt tokens found on device at admission (after a warm-up pass).

    The warm-up runs without hints (as the paper's warm-up does), unless ``hinted_warmup``: then
    the first request's steps are known before it (the orchestrator announced the workflow)."""
    cfg = CacheConfig(device_tokens=device_tokens, host_tokens=host_tokens, policy=policy,
                      prefetch=prefetch)
    future = [r.prompt for r in trace.requests]
    cache = KVCache(cfg, policy=BeladyPolicy(future) if policy == "belady" else None)
    if hinted_warmup:
        cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps=trace.requests[0].steps))
    for agent, fixed in trace.agents.items():  # warm-up: every fixed prompt cached once
        _insert(cache, fixed, ("ns", agent), len(fixed))  # not admitted: Belady's clock stays at 0
    hit = total = 0
    for req in trace.requests:
        cache.apply_steps(StepsUpdate(workflow_id="w", namespace="ns", steps=req.steps))
        if prefetch:
            for task in cache.plan_prefetch().tasks:
                cache.complete_load(task)  # transfers finish while the previous agent runs
        adm = cache.admit(req.prompt)
        hit += min(adm.match.device_tokens, len(req.fixed))
        total += len(req.fixed)
        if adm.load is not None:
            cache.complete_load(adm.load)
        have = adm.match.device_slots + (adm.load.device_slots if adm.load else ())
        full = req.prompt + req.output
        alloc = cache.alloc_device(len(full) - len(have))
        if alloc.slots is None:
            raise RuntimeError("device pool too small for one request")
        cache.insert(full, have + alloc.slots, agent=("ns", req.agent), fixed_prefix_tokens=len(req.fixed))
        cache.unlock(adm.match.last_node)
    cache.check_integrity()
    return hit / total


def run_quality(args: argparse.Namespace) -> None:
    for trace in (synthetic_trace(), metagpt_trace()):  # deterministic: --seed is for op cost
        all_fixed = sum(len(f) for f in trace.agents.values())
        print(f"== policy quality: {trace.name}, {len(trace.requests)} requests, fixed prompts "
              f"{all_fixed} tokens; device-hit ratio of fixed-prompt tokens")
        print(f"{'device':>8}{'lru':>9}{'kvflow':>9}{'belady':>9}{'belady-kvflow':>15}"
              f"{'kvflow hw':>11}{'kvflow+pf':>11}")
        for frac in (0.3, 0.5, 0.7):
            device = int(frac * all_fixed)
            host = 4 * all_fixed
            r = {p: replay(trace, p, device, host, prefetch=False) for p in ("lru", "kvflow", "belady")}
            hw = replay(trace, "kvflow", device, host, prefetch=False, hinted_warmup=True)
            pf = replay(trace, "kvflow", device, host, prefetch=True)
            gap = 100 * (r["belady"] - r["kvflow"])
            print(f"{int(frac * 100):>7}%{r['lru']:>9.3f}{r['kvflow']:>9.3f}{r['belady']:>9.3f}{gap:>13.1f}pp"
                  f"{hw:>11.3f}{pf:>11.3f}")
        print("(kvflow hw: the workflow's first steps known before the warm-up; kvflow+pf: kvflow "
              "eviction plus prefetch of the agents due next, transfers done while the previous agent "
              "runs; all other columns have no prefetch)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-ops", action="store_true")
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    if not args.skip_quality:
        run_quality(args)
    if not args.skip_ops:
        run_op_cost(args)


if __name__ == "__main__":
    main()
