"""Follows one workflow instance and answers steps-to-execution for every node and agent."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping

from .stepmath import expected_steps
from .constants import END
from .errors import WorkflowError

if TYPE_CHECKING:
    from .asg import AgentStepGraph
    from .branch_stats import BranchStats

__all__ = ["StepTracker"]


class StepTracker:
    """Run-time state of one workflow instance over an :class:`AgentStepGraph`.

    State: a *set* of triggered nodes (triggering a triggered node again changes nothing, like a
    LangGraph channel), a *multiset* of running nodes (a node may run as several tasks at once,
    e.g. LangGraph ``Send``), and the arrived flags of every AND-join. A node may be running and
    triggered at the same time (cycles).

    Creation: if START has no conditional edges its plain targets are triggered; if it has any,
    START counts as running and the caller must ``finish(START, goto=...)`` with the router's choice.

    Transitions (anything else raises :class:`WorkflowError` and leaves the state unchanged):

    * ``start(node, tasks=1)``: ``node`` must be triggered; its trigger is consumed and it runs as
      ``tasks`` tasks (each needs its own ``finish``).
    * ``finish(node, goto=None)``: ``node`` must be running; one of its tasks ends. Its plain edges
      fire by themselves; ``goto`` is what its conditional edges chose: a node name, a list of names
      (fan-out), END, or None/[] when the router chose nothing. Every name must be a declared target
      of that node's conditional edges. Firing triggers plain and chosen targets and marks the node
      arrived in each AND-join it belongs to; a join whose members have all arrived triggers its
      target and resets its flags.

    Reading: ``steps()`` is the least fixed point of the equations in :mod:`kvflow_orch._steps`
    (``math.inf`` for nodes that cannot run again); with ``branch_stats`` it is the expected steps of
    :mod:`kvflow_orch.stepmath` under the routing probabilities learned so far: the first read after
    each transition asks the graph's shared tables (:mod:`kvflow_orch._expected`) for their current
    solution, so decisions observed during the run reach the steps. ``agent_steps()`` is the min over
    each agent identity's nodes, ``done`` is true when nothing is running or triggered. Updates cost
    O(out-degree); ``steps()`` is O(V + E) (plus O(V) per active node with statistics) and cached
    until the next transition.
    """

    __slots__ = ("_asg", "_graph", "_running", "_triggered", "_arrived", "_pending", "_cache", "_tables", "_stats")

    def __init__(self, asg: "AgentStepGraph", branch_stats: "BranchStats | None" = None) -> None:
        self._asg = asg
        self._stats = branch_stats  # the graph's tables for these statistics live as long as they do
        self._tables = asg.expected_tables(branch_stats) if branch_stats is not None else None  # follows the stats
        self._graph = graph = asg.index
        index = graph.triggers
        self._running: dict[int, int] = {}
        self._triggered: dict[int, None] = {}  # an insertion-ordered set
        self._arrived: list[bool] = [False] * len(index.slot_group)
        self._pending: list[int] = [len(slots) for slots in index.group_slots]
        self._cache: list[float] | None = None
        start = graph.start
        if graph.goto_ok[start]:
            self._running[start] = 1
        else:
            self._fire(start, ())

    # ----------------------------------------------------------------- transitions
    def start(self, node: str, tasks: int = 1) -> None:
        """Consume ``node``'s trigger and mark it running as ``tasks`` concurrent tasks."""
        u = self._asg.node_index(node)
        if u not in self._triggered:
            raise WorkflowError(f"start({node!r}): node {node!r} is not triggered")
        if not isinstance(tasks, int) or tasks < 1:
            raise WorkflowError(f"start({node!r}): tasks must be a positive integer, got {tasks!r}")
        del self._triggered[u]
        self._running[u] = self._running.get(u, 0) + tasks
        self._cache = None

    def finish(self, node: str, goto: "str | Iterable[str] | None" = None) -> None:
        """End one task of ``node`` and fire its edges (``goto``: its conditional edges' choice)."""
        u = self._asg.node_index(node, allow_start=True)
        if not self._running.get(u):
            raise WorkflowError(f"finish({node!r}): node {node!r} is not running")
        chosen = self._chosen(node, u, goto)
        if self._running[u] == 1:
            del self._running[u]
        else:
            self._running[u] -= 1
        self._fire(u, chosen)

    def _chosen(self, node: str, u: int, goto: "str | Iterable[str] | None") -> tuple[int, ...]:
        if goto is None:
            return ()
        names = (goto,) if isinstance(goto, str) else tuple(goto)
        allowed = self._graph.goto_ok[u]
        for name in names:
            if name not in allowed:
                declared = sorted(allowed) or "none: it has no conditional edges"
                raise WorkflowError(
                    f"finish({node!r}, goto={name!r}): not a declared target of {node!r}'s "
                    f"conditional edges (declared: {declared})"
                )
        index_of = self._graph.index_of
        return tuple(index_of[name] for name in names if name != END)

    def _fire(self, u: int, chosen: tuple[int, ...]) -> None:
        triggered = self._triggered
        for v in self._graph.plain[u]:
            triggered[v] = None
        for v in chosen:
            triggered[v] = None
        index = self._graph.triggers
        arrived, pending = self._arrived, self._pending
        for slot in index.member_slots[u]:
            if arrived[slot]:
                continue
            arrived[slot] = True
            group = index.slot_group[slot]
            pending[group] -= 1
            if pending[group] == 0:
                triggered[index.group_target[group]] = None
                slots = index.group_slots[group]
                for s in slots:
                    arrived[s] = False
                pending[group] = len(slots)
        self._cache = None

    # ----------------------------------------------------------------- reading
    def steps(self) -> dict[str, float]:
        """Steps-to-execution of every node (START/END excluded); ``math.inf`` = never again."""
        values = self._values()  # one per index: the nodes, then START
        return dict(zip(self._graph.names, values[:self._graph.start], strict=True))

    def agent_steps(self) -> dict[str, float]:
        """Per agent identity: the min of ``steps()`` over its nodes."""
        values = self._values()
        return {agent: min(values[i] for i in members) for agent, members in self._graph.agent_members.items()}

    def _values(self) -> list[float]:
        if self._cache is None:
            active = [*self._running, *self._triggered]
            static = self._graph.solve(active, self._arrived, self._pending)
            model = self._tables.current() if self._tables is not None else None
            self._cache = static if model is None else expected_steps(model, active, static)
        return self._cache

    @property
    def done(self) -> bool:
        """True when no node is running or triggered: the instance has ended."""
        return not self._running and not self._triggered

    @property
    def running(self) -> Mapping[str, int]:
        """Read-only snapshot: running node -> number of its running tasks (START included)."""
        names = self._graph.name_of
        return MappingProxyType({names(u): n for u, n in self._running.items()})

    @property
    def triggered(self) -> frozenset[str]:
        """Snapshot of the triggered nodes (triggered and not yet started)."""
        names = self._graph.name_of
        return frozenset(names(u) for u in self._triggered)

    def __repr__(self) -> str:
        steps = {n: ("inf" if s == math.inf else s) for n, s in self.steps().items()}
        return f"StepTracker(running={dict(self.running)}, triggered={set(self.triggered)}, steps={steps})"
