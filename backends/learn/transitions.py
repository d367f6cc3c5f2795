"""Who follows whom: one decayed first-order model per namespace, with bounded memory.

Each agent's row counts its successors, the end of a session included (``None``). Observing ``s ->
t`` first multiplies ``s``'s row by ``decay``, then adds 1 to ``t``: a row remembers its last
``1 / (1 - decay)`` or so observations, so a workflow that changes is followed. Rows are bounded in
agents (the least recently observed row is forgotten) and in successors (the lightest goes).

Expected steps come from :func:`.steps.chain_from_counts` (learned routing's math), solved again
only after ``refresh`` observations, or the square of the agents over 16 when that is more (a
solve costs about that many times a request's work), so that a request pays little on average.
A young model (fewer than ``8 * refresh`` observations) is solved more often, after an eighth of
what it has seen: it learns a new app's first transitions within a few requests, while its solves
are cheap and few.
"""

from __future__ import annotations

from typing import Any

from backends.kvcache.bounded import BoundedLRU

from .steps import StepsModel, chain_from_counts

__all__ = ["TransitionModel"]

END = None


class TransitionModel:
    def __init__(self, decay: float, max_agents: int, max_successors: int, prior: float, refresh: int) -> None:
        self.decay, self.max_successors, self.prior, self.refresh = decay, max_successors, prior, refresh
        self._rows: BoundedLRU[str, dict[str | None, float]] = BoundedLRU(max_agents)
        self._solved: StepsModel | None = None
        self._dirty = 0
        self._observed = 0
        self._steps: dict[str, dict[str, float]] = {}

    def observe(self, source: str, target: str | None) -> None:
        """``target`` followed ``source`` in a session (``None``: the session ended after it)."""
        row = self._rows.get(source) or {}
        row = {t: w * self.decay for t, w in row.items()}
        row[target] = row.get(target, 0.0) + 1.0
        if len(row) > self.max_successors:
            del row[min(row, key=row.__getitem__)]
        self._rows.put(source, row)
        self._dirty += 1
        self._observed += 1

    def steps(self, current: str) -> dict[str, float]:
        """Expected steps of every agent the model knows while ``current`` runs (``current``: 0).
        The same map (do not change it) until the model is solved again: a host may build one hint
        from it per solve instead of one per request."""
        n = len(self._rows)
        due = max(1, min(self.refresh, self._observed // 8), n * n // 16)
        if self._solved is None or self._dirty >= due:
            self._solved, self._dirty, self._steps = self._solve(), 0, {}
        steps = self._steps.get(current)
        if steps is None:
            steps = {current: 0.0} if current not in self._solved.states else self._solved.steps(current)
            self._steps[current] = steps
        return steps

    def transitions(self) -> list[dict[str, Any]]:
        """Every row as ``{"from", "to", "probability", "weight"}`` (``to`` None: the session ends),
        probabilities the decayed frequencies, heaviest first within a row."""
        out = []
        for source, row in self._rows.items():
            total = sum(row.values())
            for target, weight in sorted(row.items(), key=lambda tw: -tw[1]):
                out.append({"from": source, "to": target, "probability": round(weight / total, 4),
                            "weight": round(weight, 3)})
        return out

    def __len__(self) -> int:
        return len(self._rows)

    def _solve(self) -> StepsModel:
        counts = {s: {t: w for t, w in row.items() if t is not END} for s, row in self._rows.items()}
        ends = {s: row.get(END, 0.0) for s, row in self._rows.items()}
        try:
            return chain_from_counts(counts, ends, self.prior)
        except (ZeroDivisionError, ValueError, OverflowError):  # numerically singular: no ranking now
            return chain_from_counts({}, {}, self.prior)
