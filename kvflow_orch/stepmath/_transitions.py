"""A learner's chain over named states: the API a server-side learner of plain traffic calls."""

from __future__ import annotations

from typing import Iterable, Mapping

from ._chain import ChainSteps
from ._solve import expected_steps, pooled, router_outcomes, solve


class TransitionSteps:
    """Expected steps of every state of a first-order chain over named states (agents), for a
    learner that has no workflow graph (one outcome per state: who runs next).

        chain = TransitionSteps.from_counts({"planner": {"coder": 40, "writer": 10}, "coder": {"planner": 45}},
                                            ends={"planner": 5, "coder": 5})
        chain.steps("planner")        # {"planner": 0, "coder": 1.5..., "writer": 13.6...}
        chain = chain.with_row("coder", {"planner": 0.5, "writer": 0.4})   # Sherman-Morrison, O(n^2)

    ``transitions[s][t]``: the probability that ``t`` runs next after ``s`` (a row may sum below 1:
    the rest ends the session). :meth:`from_counts` applies the thin-statistics guard
    (:func:`pooled`) to observed counts. ``steps(current)`` answers with the tracker's semantics: 0
    for the current states, the smallest score from them otherwise, ``inf`` for states that cannot
    run, every value rounded by :func:`round_steps`.
    """

    __slots__ = ("states", "_index", "_rows", "_model")

    def __init__(self, transitions: Mapping[str, Mapping[str, float]], states: Iterable[str] = ()) -> None:
        names = dict.fromkeys(states)
        for s, row in transitions.items():
            names[s] = None
            names.update(dict.fromkeys(row))
        self.states = tuple(names)
        self._index = {s: i for i, s in enumerate(self.states)}
        self._rows = tuple({self._index[t]: float(p) for t, p in transitions.get(s, {}).items()}
                           for s in self.states)
        self._model = solve([router_outcomes(r) for r in self._rows])

    @classmethod
    def from_counts(cls, counts: Mapping[str, Mapping[str, float]], ends: Mapping[str, float] | None = None,
                    states: Iterable[str] = (), alpha: float = 0.0) -> "TransitionSteps":
        """Probabilities ``(count(s -> t) + alpha) / (sum of s's counts + ends[s] + alpha * K)``
        (``K``: ``s``'s successors plus the end, when ``ends`` names ``s``), pooled where the counts
        are too thin to rank apart (:func:`pooled`; the end of a session counts as a target)."""
        ends = ends or {}
        rows = {}
        for s, row in counts.items():
            observed: dict[str | None, float] = dict(row)
            if s in ends:
                observed[None] = ends[s]
            total = sum(observed.values()) + alpha * len(observed)
            if total <= 0:
                rows[s] = {}
                continue
            probs = pooled({t: (c + alpha) / total for t, c in observed.items()}, observed)
            rows[s] = {t: p for t, p in probs.items() if t is not None}
        return cls(rows, states)

    def with_row(self, state: str, row: Mapping[str, float]) -> "TransitionSteps":
        """A copy with ``state``'s transitions replaced (an O(n^2) update of a chain)."""
        unknown = [t for t in (state, *row) if t not in self._index]
        if unknown:
            raise ValueError(f"unknown states {unknown}: build a new TransitionSteps to add states")
        u = self._index[state]
        rows = list(self._rows)
        rows[u] = {self._index[t]: float(p) for t, p in row.items()}
        new = object.__new__(TransitionSteps)
        new.states, new._index, new._rows = self.states, self._index, tuple(rows)
        if isinstance(self._model, ChainSteps):
            new._model = self._model.with_rows({u: (router_outcomes(rows[u]) or [{}])[0]})
        else:
            new._model = solve([router_outcomes(r) for r in rows])
        return new

    def steps(self, current: "str | Iterable[str]") -> dict[str, float]:
        """Expected steps of every state while ``current`` (one state or several) runs."""
        names = [current] if isinstance(current, str) else list(current)
        try:
            active = [self._index[s] for s in names]
        except KeyError as exc:
            raise ValueError(f"unknown state {exc.args[0]!r}") from None
        return dict(zip(self.states, expected_steps(self._model, active), strict=True))
