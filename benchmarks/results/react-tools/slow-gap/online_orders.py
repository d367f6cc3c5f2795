"""Online orders of paused conversations on the slow-tools-only cells (issue 24's slow-tools gap):
recomputed tokens over Bélády on each run's own schedule, mean over workload seeds.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/results/react-tools/slow-gap/online_orders.py [--seeds 4]

Every variant is kvflow with continuations on the matrix's workload (``benchmarks/react_tools.py``:
6 calls a job, pool 0.45 of the paused conversations) and differs only in how a paused
conversation's expected time to its return is computed (``Continuation.remaining_s``, or the
tools' durations the brain is told):

* ``learned``: the brain as it is (the observed durations of each tool);
* ``dist-mean``: told each tool's distribution, not its samples (``run_react(known_durations=True)``:
  the mean residual life of the true distribution);
* ``dist-median``: the same distribution, ranked by the median residual life instead;
* ``dist-mean-fresh``: ``dist-mean`` re-ranked at every deadline sweep (the brain re-ranks a
  conversation once its rank moved a whole step);
* ``overdue-now``: ``learned`` but a pause that has outlasted every observed one is due now (the
  brain's rule expects it to last as long again as it has run, which the first returns, the short
  ones, make fire early: a censoring bias);
* ``random`` and ``newest-first`` (references, no online policy would choose them): a fixed random
  rank per pause, and the newest pause kept first (expected rest = 5 s + its age).

The three ``dist-*`` rankings are what an online order can know at most on this workload (each
pause a uniform draw, independent of everything the brain sees); the best of the online ones
(all but the two references) per cell is the online bound reported in ``../README.md``. Variants
other than ``learned`` and ``dist-mean`` replace a method of the brain for the run (analysis only).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
from contextlib import contextmanager
from dataclasses import replace
from statistics import mean

import backends.kvcache.continuations as continuations
from backends.kvcache import CacheConfig
from backends.kvcache.trace import replay_schedule
from backends.sim import CostModel, get_system, load_hardware, load_model
from backends.sim.react import react_plan, run_react
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
from react_tools import pool_for, sim_spec

COST = CostModel(load_hardware("a10g"), load_model("llama-3.1-8b"))
SYSTEM = get_system("gpu-only")
Continuation = continuations.Continuation


def median_residual(self, elapsed: float) -> float:
    i = bisect.bisect_right(self.samples, elapsed)
    if i < len(self.samples):
        rest = self.samples[i:]
        return rest[len(rest) // 2] - elapsed
    return ORIGINAL_REMAINING(self, elapsed)


def overdue_now(self, elapsed: float) -> float:
    if self.samples and elapsed >= self.samples[-1] and not self.announced:
        return 0.0
    return ORIGINAL_REMAINING(self, elapsed)


def random_rank(self, elapsed: float) -> float:
    digest = hashlib.blake2b(repr((self.ref, self.paused_at)).encode(), digest_size=4).digest()
    return 10.0 + 10.0 * int.from_bytes(digest, "big") / 2**32


ORIGINAL_REMAINING = Continuation.remaining_s
ORIGINAL_EXPIRE = continuations.Continuations.expire


def fresh_expire(self, now: float):
    stale = ORIGINAL_EXPIRE(self, now)
    for session, kept in self._kept.items():
        if not kept.returned:
            steps = self._steps(kept.remaining_s(now - kept.paused_at))
            if steps != kept.steps:
                kept.steps = steps
                self.hints.set_steps(session[0], kept.ref[1], {kept.ref[1]: steps})
    return stale


VARIANTS = {  # name: (known_durations, remaining_s, expire)
    "learned": (False, None, None),
    "dist-mean": (True, None, None),
    "dist-median": (True, median_residual, None),
    "dist-mean-fresh": (True, None, fresh_expire),
    "overdue-now": (False, overdue_now, None),
    "random": (False, random_rank, None),
    "newest-first": (False, lambda self, elapsed: 5.0 + elapsed, None),
}
ONLINE = ("learned", "dist-mean", "dist-median", "dist-mean-fresh", "overdue-now")


@contextmanager
def variant(remaining, expire):
    try:
        if remaining is not None:
            Continuation.remaining_s = remaining
        if expire is not None:
            continuations.Continuations.expire = expire
        yield
    finally:
        Continuation.remaining_s = ORIGINAL_REMAINING
        continuations.Continuations.expire = ORIGINAL_EXPIRE


def ratio(agents: int, share: float, seed: int, name: str) -> float:
    args = argparse.Namespace(turns=6)
    plans = react_plan(sim_spec(args, agents, share, seed))
    pool = pool_for(plans, 0.45)
    config = CacheConfig(device_tokens=pool, policy="kvflow", continuations=True, prefetch=False,
                         namespace_cap_tokens=pool)
    known, remaining, expire = VARIANTS[name]
    with variant(remaining, expire):
        result = run_react(plans, SYSTEM, COST, config, known_durations=known)
    belady = replay_schedule(result.schedule, replace(config, policy="lru", continuations=False), belady=True)
    return result.recomputed_tokens / belady.stats.recomputed_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--slow-share", type=float, default=1.0)
    args = parser.parse_args()
    print(f"recomputed / Bélády, slow share {args.slow_share}, mean over seeds 0-{args.seeds - 1}")
    print(f"{'agents':>6} " + " ".join(f"{name:>15}" for name in VARIANTS) + f" {'best online':>12}")
    for agents in (8, 16, 32):
        seeds = range(args.seeds)
        row = {name: mean(ratio(agents, args.slow_share, seed, name) for seed in seeds) for name in VARIANTS}
        best = min(row[name] for name in ONLINE)
        print(f"{agents:>6} " + " ".join(f"{row[name]:>14.3f}x" for name in VARIANTS) + f" {best:>11.3f}x", flush=True)


if __name__ == "__main__":
    main()
