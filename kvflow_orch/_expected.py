"""Learned routing for one graph: expected-steps tables that follow the statistics during a run.

The math is :mod:`kvflow_orch.stepmath` (shared with server-side learners); this module maps an
:class:`~kvflow_orch.asg.AgentStepGraph` and a :class:`~kvflow_orch.branch_stats.BranchStats` onto
it. The outcomes of node ``u``: each plain edge and each AND-join ``u`` belongs to is a certain
outcome (joins counted as plain edges; the tracker's ``max`` with the static steps gives their wait
back); a router is one distribution over its targets (END left out): its learned probabilities,
pooled where the counts are too thin to rank targets apart (:func:`~kvflow_orch.stepmath.pooled`).
While no router's counts rank anything apart, the steps *are* the static steps and nothing is
solved: a handful of decisions never changes the order the brain sees.

**Refresh rule.** Every tracker of the graph that shares the statistics reads one
:class:`ExpectedTables`; each steps solve of a tracker (one per transition) asks it for the
current solution. It solves again once the statistics have moved by ``max(1, REFRESH_SHARE x``
the routers' decisions at the last solve``)`` observations (every decision early on, fewer once
the probabilities settle: a decision moves them by about ``1 / decisions``), and only while the
work spent stays within ``BUDGET_OPS`` multiply-adds per transition, amortised: a solve waits
until the transitions since the last one have earned its cost (a small graph is covered at once;
a 100-node graph's first solve waits about 2,000 transitions, with static steps until then). A
chain whose router rows changed is updated by rank-one steps instead of a new inversion where that
is cheaper (:meth:`~kvflow_orch.stepmath.ChainSteps.with_rows`). Work is counted in multiply-adds,
not seconds, so a run is reproducible on every machine; ``benchmarks/orch_overhead.py`` measures
what a transition costs in time.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import TYPE_CHECKING

from .constants import END
from .stepmath import ChainSteps, OutcomeSteps, pooled, router_outcomes, solve, solve_ops

if TYPE_CHECKING:
    from .asg import AgentStepGraph
    from .branch_stats import BranchStats

__all__ = ["ExpectedTables", "BUDGET_OPS", "REFRESH_SHARE"]

BUDGET_OPS = 500
"""Solver work (multiply-adds) each transition earns: about 0.03 ms of pure Python (60 ns each)."""
REFRESH_SHARE = 1 / 16
"""Solve again after this share of the routers' decisions (at least one) was observed anew."""
_CREDIT_CAP = 4  # credit saved up to this many solves of the last cost


class ExpectedTables:
    """The expected-steps solution of one graph under one statistics object, kept current.

    ``current()`` returns the solution for the statistics as of the last refresh (None: no router
    has learned anything yet, the steps are static); ``solves`` counts full solves and ``updates``
    chain updates (rank-one, or a new inversion where the chain takes one), for benchmarks and tests.
    """

    budget_ops = BUDGET_OPS

    def __init__(self, asg: "AgentStepGraph", stats: "BranchStats") -> None:
        index = asg.index
        triggers = index.triggers
        # weak: the graph keeps its tables per statistics object in a WeakKeyDictionary, which a
        # strong reference from the value would keep alive forever (trackers hold the statistics)
        self._stats = weakref.ref(stats)
        self._workflow = asg.name
        self._size = triggers.size
        self._always = []
        for u in range(self._size):
            joins = (triggers.group_target[triggers.slot_group[s]] for s in triggers.member_slots[u])
            self._always.append(tuple(dict.fromkeys((*index.plain[u], *joins))))
        self._routers = [(u, index.name_of(u), sorted(targets)) for u, targets in enumerate(index.goto_ok) if targets]
        self._index_of = index.index_of
        self._lock = threading.Lock()
        self._model: ChainSteps | OutcomeSteps | None = None
        self._version: int | None = None  # stats version of the last refresh
        self._due = 1  # observations after which the next refresh is due
        self._rows: dict[int, dict[int, float]] = {}  # router -> the distribution solved with
        self._cap = float(_CREDIT_CAP * BUDGET_OPS)
        self._credit = self._cap  # a small graph's first solve needs no waiting
        self._waiting_for = 0.0  # credit a refresh found too little of
        self.solves = 0
        self.updates = 0

    def current(self) -> ChainSteps | OutcomeSteps | None:
        """The solution to read steps from (refreshed first when the refresh rule allows)."""
        stats = self._stats()
        if stats is None:
            return self._model
        with self._lock:
            self._credit = min(self._credit + BUDGET_OPS, self._cap)
            version = stats.version
            if self._version is not None and (version - self._version < self._due or self._credit < self._waiting_for):
                return self._model
            self._refresh(stats, version)
            return self._model

    # ----------------------------------------------------------------- solving
    def _refresh(self, stats: "BranchStats", version: int) -> None:
        workflow = self._workflow
        rows: dict[int, dict[int, float]] = {}
        decisions = 0.0
        learned = False
        for u, name, targets in self._routers:
            probs = pooled(stats.probabilities(workflow, name, targets), stats.counts(workflow, name))
            rows[u] = {self._index_of[t]: p for t, p in probs.items() if t != END}
            decisions += stats.decisions(workflow, name)
            learned = learned or len(set(probs.values())) > 1
        model, cost = self._solve(rows) if learned else (None, 0.0)
        if learned and model is None:  # not enough credit yet
            return
        self._model, self._rows = model, rows
        self._version = version
        self._due = max(1, math.ceil(REFRESH_SHARE * decisions))
        self._credit -= cost
        self._cap = float(_CREDIT_CAP * max(cost, BUDGET_OPS))
        self._waiting_for = 0.0

    def _solve(self, rows: dict[int, dict[int, float]]):
        """``(solution, cost)``, or ``(None, 0)`` when the credit does not cover it yet."""
        previous = self._model
        if isinstance(previous, ChainSteps):
            changed = {u: (router_outcomes(r) or [{}])[0] for u, r in rows.items() if r != self._rows[u]}
            if not changed:  # the statistics moved elsewhere (another workflow's routers)
                return previous, 0.0
            cost = previous.update_ops(len(changed))
            if not self._affords(cost):
                return None, 0.0
            self.updates += 1
            return previous.with_rows(changed), cost
        outcomes = [[{w: 1.0} for w in self._always[u]] + (router_outcomes(rows[u]) if u in rows else [])
                    for u in range(self._size)]
        cost = solve_ops(outcomes)
        if not self._affords(cost):
            return None, 0.0
        self.solves += 1
        return solve(outcomes), cost

    def _affords(self, cost: float) -> bool:
        if cost <= self._credit:
            return True
        self._waiting_for = cost
        self._cap = max(self._cap, cost)
        return False
