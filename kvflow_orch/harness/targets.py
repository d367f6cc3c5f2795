"""The simulator's targets, checked on sweep results and printed with the figures behind them: the
paper's system ordering and shrinking gain with output length, kvflow near infinite where prefetch
fits, the Belady gap, the standard sweep's wall time, and for ``kvflow-learned``: its device-hit
ratio near Belady's and its gain over static ``kvflow`` on skewed-routing workloads, and no change
on static ones."""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple, Sequence

from backends.sim.cost import CostModel

from .report import config_label
from .sweep import ScenarioResult

__all__ = ["TargetCheck", "prefetch_fits", "check_targets", "learned_bounds", "markov_bound"]


class TargetCheck(NamedTuple):
    """One target: its name, whether the results meet it, and the figures behind the verdict."""

    name: str
    ok: bool
    detail: str


def prefetch_fits(sr: ScenarioResult) -> tuple[bool, str]:
    """Whether every instance's next agent prefix fits beside the running calls and all those
    prefixes cross the link faster than one agent call runs (the regime where prefetch can hide
    every load, so kvflow should come within 10% of infinite)."""
    s = sr.scenario
    w = s.workload
    n = len(w.instances)
    spec = getattr(w.instances[0], "spec", None)
    if spec is None:
        return False, "recorded trace: no single agent shape"
    fixed = max(len(t) for t in spec.fixed.values())
    kvflow = sr.results.get("kvflow")
    device = kvflow.device_tokens if kvflow else (s.device_tokens or 0)
    working = n * (2 * fixed + spec.dynamic_tokens + spec.output_tokens)
    cost = CostModel(s.hardware, s.model)
    run = cost.prefill_time(spec.dynamic_tokens, fixed) + spec.output_tokens * cost.decode_time(
        [fixed + spec.dynamic_tokens] * n)
    transfer = n * cost.transfer_time(fixed)
    ok = working <= device and transfer < run
    return ok, f"working set {working} vs pool {device} tokens; transfers {transfer:.3f}s vs agent run {run:.3f}s"


def _lat(sr: ScenarioResult, name: str) -> float:
    return sr.results[name].latency_s


def check_targets(results: Sequence[ScenarioResult], wall_s: float | None = None) -> list[TargetCheck]:
    out: list[TargetCheck] = []
    single = [sr for sr in results if sr.scenario.group.startswith("single-b")
              and sr.scenario.hardware.name == "h100-sxm" and sr.scenario.model.name == "qwen2.5-32b"
              and {"kvflow", "hicache", "gpu-only", "kvflow-evict"} <= set(sr.results)]
    large = [sr for sr in single if sr.scenario.workload.labels["fixed"] >= 4096]
    for sr in large:
        k, e, h, g = (_lat(sr, n) for n in ("kvflow", "kvflow-evict", "hicache", "gpu-only"))
        ok = k < h < g and k <= e <= h
        out.append(TargetCheck(f"ordering {config_label(sr)}", ok,
                               f"kvflow {k:.2f}s <= kvflow-evict {e:.2f}s <= hicache {h:.2f}s < gpu-only {g:.2f}s"))
    by_key: dict[tuple, dict[int, float]] = {}
    for sr in large:
        lab = sr.scenario.workload.labels
        by_key.setdefault((lab["fixed"], lab["branches"]), {})[lab["output"]] = _lat(sr, "hicache") / _lat(sr, "kvflow")
    for (fixed, branches), gains in sorted(by_key.items()):
        if len(gains) >= 2:
            outs = sorted(gains)
            ok = all(gains[a] >= gains[b] for a, b in pairwise(outs))
            text = ", ".join(f"output {o}: {gains[o]:.3f}x" for o in outs)
            out.append(TargetCheck(f"gain over hicache shrinks with output ({fixed} b{branches})", ok, text))
    for sr in results:
        if not {"kvflow", "infinite"} <= set(sr.results):
            continue
        fits, why = prefetch_fits(sr)
        if fits:
            gap = _lat(sr, "kvflow") / _lat(sr, "infinite") - 1
            out.append(TargetCheck(f"kvflow within 10% of infinite: {sr.scenario.group} {config_label(sr)}",
                                   gap <= 0.10, f"gap {gap:+.1%} ({why})"))
    gaps = [(_lat(sr, "kvflow") / _lat(sr, "belady") - 1, sr)
            for sr in results if {"kvflow", "belady"} <= set(sr.results)]
    if gaps:
        worst = max(gaps, key=lambda g: abs(g[0]))
        out.append(TargetCheck("belady gap reported (kvflow / belady - 1)", True,
                               f"{len(gaps)} scenarios, range {min(g for g, _ in gaps):+.2%} .. "
                               f"{max(g for g, _ in gaps):+.2%}; largest |gap| at {worst[1].scenario.group} "
                               f"{config_label(worst[1])}"))
    out += _learned_targets(results)
    if wall_s is not None:
        out.append(TargetCheck("standard sweep under 5 minutes", wall_s < 300, f"{wall_s:.1f}s wall"))
    return out


LEARNED_HIT_POINTS = 0.05
LEARNED_SPEEDUP = 1.15
STATIC_TOLERANCE = 0.01


def _expensive(sr: ScenarioResult) -> bool:
    """Misses are expensive: no host tier (recompute), or the slow link."""
    return sr.results["kvflow"].host_tokens == 0 or "GB/s" in sr.scenario.hardware.name


def _speed_bound(sr: ScenarioResult) -> tuple[str, float] | None:
    """The best end-to-end gain over static kvflow that eviction and routing prediction can give
    on this run: Bélády's eviction (with kvflow's prefetch) or the perfect-prediction oracle
    (Bélády + prefetch from the realized future), whichever is larger; None if neither ran."""
    r = sr.results
    bounds = [(n, _lat(sr, "kvflow") / _lat(sr, n)) for n in ("belady", "oracle") if n in r]
    return max(bounds, key=lambda b: b[1]) if bounds else None


def markov_bound(sr: ScenarioResult, calls: int = 100_000, seed: int = 0) -> dict | None:
    """For one instance of a workload whose every agent routes by a weight table (the swarm):
    the pool in agent prefixes ``k``, and the call hit shares of LRU, the expected-steps rule, the
    best online policy (knowing the true table) and Bélády, over a long walk and over the path
    this run took (see :mod:`backends.sim.markov`). None for other workloads."""
    import random

    from backends.sim.markov import belady_hits, chain_of_routing, hit_rates

    w = sr.scenario.workload
    if len(w.instances) != 1 or "kvflow" not in sr.results or sr.scenario.device_tokens is None:
        return None
    spec = w.instances[0].spec
    routing = getattr(spec, "routing", None) or {}
    agents = sorted(spec.fixed)
    if not routing or set(routing) != set(agents):
        return None
    sizes = [len(spec.fixed[a]) for a in agents]
    room = spec.dynamic_tokens + spec.output_tokens + 64
    # the pool was sized as whole prefixes plus room for the running call (int() may shave a token)
    k = int((sr.scenario.device_tokens - room) / (sum(sizes) / len(sizes)) + 0.01)
    if not 1 <= k < len(agents):
        return None
    path = sr.results["kvflow"].paths[0] if sr.results["kvflow"].paths else ()
    chain = chain_of_routing(routing, agents, start=path[0] if path else None)
    long_run = hit_rates(chain, k, [chain.walk(calls, random.Random(seed))])
    seq = [agents.index(a) for a in path]
    this_run = hit_rates(chain, k, [seq]) if seq else None
    return {"k": k, "long": long_run, "run": this_run, "belady_run": belady_hits(seq, k) / len(seq) if seq else None}


def learned_bounds(results: Sequence[ScenarioResult]) -> list[str]:
    """The "Bounds" section of a routed-workload summary: per configuration, the end-to-end gain
    over static kvflow of kvflow-learned, Bélády, the oracle and infinite (the best any eviction,
    any routing prediction and any pool size could give), and the device-hit ratios."""
    routed = [sr for sr in results if "zipf_s" in sr.scenario.workload.labels
              and {"kvflow", "kvflow-learned"} <= set(sr.results)]
    if not routed:
        return []
    head = (f"{'group':<18} {'config':<22} {'model':<13} {'learned':>8} {'belady':>8} {'oracle':>8} {'infinite':>9}"
            f"   {'hit learned':>11} {'belady':>7} {'oracle':>7}")
    lines = ["Bounds: end-to-end speedup over static kvflow (latency kvflow / latency system), device-hit ratio",
             head, "-" * len(head)]
    for sr in routed:
        r = sr.results
        gain = {n: (f"{_lat(sr, 'kvflow') / _lat(sr, n):.3f}x" if n in r else "-")
                for n in ("kvflow-learned", "belady", "oracle", "infinite")}
        hit = {n: (f"{r[n].device_hit_ratio:.1%}" if n in r else "-") for n in ("kvflow-learned", "belady", "oracle")}
        lines.append(f"{sr.scenario.group:<18} {config_label(sr):<22} {sr.scenario.model.name:<13} "
                     f"{gain['kvflow-learned']:>8} {gain['belady']:>8} {gain['oracle']:>8} {gain['infinite']:>9}"
                     f"   {hit['kvflow-learned']:>11} {hit['belady']:>7} {hit['oracle']:>7}")
    expensive = [(sr, _speed_bound(sr)) for sr in routed if _expensive(sr)]
    bounded = [(sr, b) for sr, b in expensive if b is not None]
    if bounded:
        over = [(sr, b) for sr, b in bounded if b[1] >= LEARNED_SPEEDUP]
        top = max(bounded, key=lambda x: x[1][1])
        lines.append(
            f"Where misses are expensive ({len(bounded)} configurations), the best of Bélády eviction and the "
            f"perfect-prediction oracle reaches at most {top[1][1]:.3f}x over static kvflow "
            f"({top[0].scenario.group} {config_label(top[0])} {top[0].scenario.model.name}, {top[1][0]}); "
            + (f"{LEARNED_SPEEDUP}x exceeds that bound in every one of them: no eviction order and no routing "
               "predictor driving this brain can reach it."
               if not over else
               f"{len(over)} configuration(s) have a bound >= {LEARNED_SPEEDUP}x: "
               + ", ".join(f"{sr.scenario.group} {config_label(sr)} {sr.scenario.model.name}" for sr, _ in over)))
        host = [sr for sr, _ in bounded if sr.results["kvflow"].host_tokens and "infinite" in sr.results]
        wide = [sr for sr in host if _lat(sr, "kvflow") / _lat(sr, "infinite") >= LEARNED_SPEEDUP]
        if host:
            lines.append(
                f"Scope: without a host tier nothing can be prefetched, so Bélády bounds every policy; with one, "
                f"the oracle bounds every predictor feeding this brain's prefetch rule, not every conceivable "
                f"transfer schedule. Infinite (no misses at all) is >= {LEARNED_SPEEDUP}x in {len(wide)} of the "
                f"{len(host)} host-tier configurations"
                + (": " + ", ".join(f"{sr.scenario.group} {config_label(sr)} {sr.scenario.model.name} "
                                    f"({_lat(sr, 'kvflow') / _lat(sr, 'infinite'):.3f}x)" for sr in wide)
                   + "; there 1.15x is shown out of reach for every routing predictor feeding this brain (the "
                     "oracle's figure), not for every conceivable transfer schedule." if wide else "."))
    seen: set[tuple] = set()
    for sr in routed:
        key = (sr.scenario.group, config_label(sr), sr.scenario.device_tokens)
        if key in seen or sr.results["kvflow"].host_tokens != 0:
            continue  # the paging model has no host tier; one line per pool and path
        seen.add(key)
        mb = markov_bound(sr)
        if mb is None:
            continue
        lr, run = mb["long"], mb["run"]
        lines.append(
            f"Markov paging bound, {sr.scenario.group} {config_label(sr)} "
            f"(pool of {mb['k']} agent prefixes, calls hit): "
            f"long run ({lr.calls} calls): LRU {lr.lru:.1%}, expected steps {lr.expected_steps:.1%}, best online "
            f"policy {lr.best_online:.1%}, Bélády {lr.belady:.1%} (gap {100 * (lr.belady - lr.best_online):.1f} points)"
            + (f"; this run's {run.calls}-call path: expected steps {run.expected_steps:.1%}, best online "
               f"{run.best_online:.1%}, Bélády {run.belady:.1%}" if run else ""))
    return lines


def _learned_targets(results: Sequence[ScenarioResult]) -> list[TargetCheck]:
    out: list[TargetCheck] = []
    static: list[tuple[float, ScenarioResult]] = []
    for sr in results:
        r = sr.results
        if not {"kvflow", "kvflow-learned"} <= set(r):
            continue
        name = f"{sr.scenario.group} {config_label(sr)} {sr.scenario.model.name}"
        if "zipf_s" not in sr.scenario.workload.labels:
            static.append((_lat(sr, "kvflow-learned") / _lat(sr, "kvflow") - 1, sr))
            continue
        hits = {k: v.device_hit_ratio for k, v in r.items()}
        if "belady" in r:
            ok = hits["kvflow-learned"] >= hits["belady"] - LEARNED_HIT_POINTS
            why = ""
            mb = None if ok or r["kvflow"].host_tokens else markov_bound(sr)
            if mb is not None:
                gap = mb["long"].belady - mb["long"].best_online
                why = (f"; bound: the best online policy knowing the true routing hits {mb['long'].best_online:.1%} "
                       f"of calls vs Bélády {mb['long'].belady:.1%} in the long run ({100 * gap:.1f} points"
                       + (", so the target is infeasible online)" if gap > LEARNED_HIT_POINTS else ")"))
            out.append(TargetCheck(
                f"kvflow-learned device hits within {LEARNED_HIT_POINTS:.0%} points of belady: {name}", ok,
                f"learned {hits['kvflow-learned']:.1%}, belady {hits['belady']:.1%}, kvflow {hits['kvflow']:.1%}{why}"))
        if _expensive(sr):
            gain = _lat(sr, "kvflow") / _lat(sr, "kvflow-learned")
            b = _speed_bound(sr)
            bound = "" if b is None else (f", bound {b[1]:.3f}x ({b[0]})"
                                          + (" < target: infeasible" if b[1] < LEARNED_SPEEDUP else ""))
            out.append(TargetCheck(f"kvflow-learned >= {LEARNED_SPEEDUP}x over kvflow (misses expensive): {name}",
                                   gain >= LEARNED_SPEEDUP, f"{gain:.3f}x{bound}"))
    if static:
        worst = max(static, key=lambda g: abs(g[0]))
        out.append(TargetCheck(
            f"kvflow-learned equals kvflow on static workloads (within {STATIC_TOLERANCE:.0%})",
            abs(worst[0]) <= STATIC_TOLERANCE,
            f"{len(static)} scenarios, latency range {min(g for g, _ in static):+.2%} .. "
            f"{max(g for g, _ in static):+.2%}; largest at {worst[1].scenario.group} {config_label(worst[1])}"))
    return out
