"""The Agent Step Graph (ASG): a validated, indexed view of a workflow.

:meth:`Workflow.compile` (and the LangGraph adapter) produce an :class:`AgentStepGraph`. It is
immutable; the per-instance state lives in a :class:`~kvflow_orch.tracker.StepTracker`
(``asg.tracker()``).

Trigger groups: a plain edge ``u -> v`` is the group ``{u}`` of ``v``; a conditional edge
from ``r`` listing ``v`` is the group ``{r}`` of ``v``; an AND edge ``[u1..uk] -> v`` is one group
whose members carry *arrived* flags. START may be the source of plain and conditional edges and
nothing else; END may only be a target.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ._expected import ExpectedTables
from ._steps import TriggerIndex, solve_steps
from .constants import END, RESERVED_NAMES, START
from .errors import WorkflowError
from .export import describe, to_mermaid, to_networkx
from .nodes import Branch, Node
from .protocol import MAX_AGENTS, check_name
from .tracker import StepTracker

if TYPE_CHECKING:
    import networkx as nx

    from .branch_stats import BranchStats
    from .builder import Workflow

__all__ = ["AgentStepGraph", "GraphIndex", "ExpectedTables"]


@dataclass(frozen=True, slots=True)
class GraphIndex:
    """The compiled, read-only form of an ASG that a :class:`~kvflow_orch.tracker.StepTracker`
    runs on (``asg.index``).

    Dense indices: ``0..len(names)-1`` are the nodes in declaration order and ``len(names)`` is
    START; END has no index (firing it triggers nothing).
    """

    names: tuple[str, ...]
    index_of: Mapping[str, int]
    """Node name (START included) -> index."""
    triggers: TriggerIndex
    plain: tuple[tuple[int, ...], ...]
    """Index -> indices its plain edges trigger (END dropped)."""
    goto_ok: tuple[frozenset[str], ...]
    """Index -> names its conditional edges may choose (END included); empty: no router."""
    agent_members: Mapping[str, tuple[int, ...]]
    """Agent identity -> indices of its LLM nodes."""

    @property
    def start(self) -> int:
        return len(self.names)

    def name_of(self, u: int) -> str:
        return self.names[u] if u < len(self.names) else START

    def solve(self, active: list[int], arrived: list[bool], pending: list[int]) -> list[float]:
        """Steps of every index for this run-time state (see :func:`~kvflow_orch._steps.solve_steps`)."""
        return solve_steps(self.triggers, active, arrived, pending)


class AgentStepGraph:
    """A validated workflow graph with its trigger groups precomputed.

    Build it with :meth:`from_workflow` / :meth:`Workflow.compile` or with the LangGraph adapter's
    :func:`kvflow_orch.langgraph.compile_langgraph`; the keyword constructor is the low-level entry
    both use (every argument is validated here, and every error is a :class:`WorkflowError` naming
    the node or edge at fault).

    Invariants: ``nodes`` excludes START/END; every node is reachable from START (its initial
    steps are finite); LLM nodes sharing an agent identity share one system prompt. ``index`` is
    the compiled :class:`GraphIndex` trackers run on.
    """

    def __init__(
        self,
        *,
        name: str,
        nodes: Mapping[str, Node],
        edges: Iterable[tuple[str, str]] = (),
        joins: Iterable[tuple[Sequence[str], str]] = (),
        branches: Iterable[Branch] = (),
        reducers: Mapping[str, Any] | None = None,
        duplicates: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.nodes: Mapping[str, Node] = MappingProxyType(dict(nodes))
        self.reducers: Mapping[str, Any] = MappingProxyType(dict(reducers or {}))
        edges = [tuple(e) for e in edges]
        self.joins: tuple[tuple[tuple[str, ...], str], ...] = tuple(
            (tuple(members), target) for members, target in joins
        )
        branches = tuple(branches)
        _check_names(self.nodes, duplicates)
        _check_edges(self.nodes, edges, self.joins, branches)
        self._agents, self._systems = _agent_identities(self.nodes)

        self._plain: dict[str, tuple[str, ...]] = {}
        for u, v in edges:
            self._plain[u] = tuple(dict.fromkeys((*self._plain.get(u, ()), v)))
        self._branches: dict[str, tuple[Branch, ...]] = {}
        for branch in branches:
            self._branches[branch.source] = (*self._branches.get(branch.source, ()), branch)
        if not self._plain.get(START) and not self._branches.get(START):
            raise WorkflowError("no edge from START: add wf.add_edge(START, '<first node>')")

        self.index = self._build_index()
        self._expected: weakref.WeakKeyDictionary[BranchStats, ExpectedTables] = weakref.WeakKeyDictionary()
        self._expected_lock = threading.Lock()
        self._check_reachable()

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_workflow(cls, wf: "Workflow") -> "AgentStepGraph":
        """Validate a :class:`~kvflow_orch.builder.Workflow` and index its trigger groups."""
        return cls(
            name=wf.name,
            nodes=wf.nodes,
            edges=wf.edges,
            joins=wf.joins,
            branches=wf.branches,
            reducers=wf.reducers,
            duplicates=wf.duplicates,
        )

    @classmethod
    def from_langgraph(cls, graph: Any, agents: Mapping[str, str] | None = None) -> "AgentStepGraph":
        """Deprecated: use :func:`kvflow_orch.langgraph.compile_langgraph` (the adapter builds ASGs;
        the ASG knows nothing of LangGraph)."""
        warnings.warn("AgentStepGraph.from_langgraph is deprecated; use kvflow_orch.langgraph.compile_langgraph",
                      DeprecationWarning, stacklevel=2)
        from .langgraph import compile_langgraph  # the one edge back, kept for callers of the old name

        return compile_langgraph(graph, agents)

    def _build_index(self) -> GraphIndex:
        names = tuple(self.nodes)
        idx = {n: i for i, n in enumerate(names)}
        idx[START] = len(names)
        singles = [(idx[u], idx[v]) for u, targets in self._plain.items() for v in targets if v != END]
        for source, branches in self._branches.items():
            singles += [(idx[source], idx[v]) for b in branches for v in b.targets if v != END]
        ands = [(tuple(idx[m] for m in members), idx[t]) for members, t in self.joins if t != END]
        return GraphIndex(
            names=names,
            index_of=MappingProxyType(idx),
            triggers=TriggerIndex.build(len(names) + 1, singles, ands),
            plain=tuple(tuple(idx[v] for v in self._plain.get(n, ()) if v != END) for n in (*names, START)),
            goto_ok=tuple(
                frozenset(v for b in self._branches.get(n, ()) for v in b.targets) for n in (*names, START)
            ),
            agent_members=MappingProxyType(
                {a: tuple(idx[n] for n in members) for a, members in self._agents.items()}
            ),
        )

    def _check_reachable(self) -> None:
        # A node is reachable exactly when its steps are finite in the initial state, which also
        # catches AND-joins waiting on a member that can never arrive.
        tracker = self.tracker()
        steps = tracker.steps()
        unreachable = [n for n, s in steps.items() if s == float("inf")]
        if unreachable:
            listed = ", ".join(repr(n) for n in unreachable)
            raise WorkflowError(
                f"node(s) {listed} unreachable from START in workflow {self.name!r}: no chain of "
                f"edges (with every member of each AND-join reachable) leads there"
            )

    # ----------------------------------------------------------------- read API
    def plain_targets(self, node: str) -> tuple[str, ...]:
        """Targets of ``node``'s plain edges, in declaration order (may include END)."""
        self.node_index(node, allow_start=True)
        return self._plain.get(node, ())

    def branches_of(self, node: str) -> tuple[Branch, ...]:
        """Conditional edges leaving ``node`` (START allowed)."""
        self.node_index(node, allow_start=True)
        return self._branches.get(node, ())

    @property
    def agents(self) -> Mapping[str, tuple[str, ...]]:
        """Agent identity -> its LLM nodes, in declaration order."""
        return MappingProxyType(self._agents)

    def agent_of(self, node: str) -> str | None:
        """The agent identity of ``node``, or None for a plain Python node (or START/END)."""
        if node in RESERVED_NAMES:
            return None
        self.node_index(node)
        return self.nodes[node].agent

    def system_prompt(self, agent: str) -> str:
        """The fixed system prompt shared by the nodes of ``agent``."""
        try:
            return self._systems[agent]
        except KeyError:
            raise WorkflowError(f"unknown agent {agent!r}; agents: {sorted(self._systems)}") from None

    def tracker(self, branch_stats: "BranchStats | None" = None) -> StepTracker:
        """A fresh :class:`StepTracker` for one instance of this workflow. With ``branch_stats``
        its ``steps()`` are the expected steps under the learned routing probabilities, which
        follow the statistics while the instance runs (:meth:`expected_tables`); without, the
        static steps."""
        return StepTracker(self, branch_stats)

    def routing_probabilities(self, branch_stats: "BranchStats") -> dict[str, dict[str, float]]:
        """Router (START included) -> target (END included) -> learned probability."""
        index = self.index
        return {
            index.name_of(u): branch_stats.probabilities(self.name, index.name_of(u), sorted(targets))
            for u, targets in enumerate(index.goto_ok)
            if targets
        }

    def expected_tables(self, branch_stats: "BranchStats") -> ExpectedTables:
        """The expected-steps tables of :mod:`kvflow_orch._expected` under ``branch_stats``: one
        object per statistics object, shared by every tracker of this graph, which solves again as
        the statistics move (``current()``)."""
        with self._expected_lock:
            tables = self._expected.get(branch_stats)
            if tables is None:
                tables = self._expected[branch_stats] = ExpectedTables(self, branch_stats)
            return tables

    def to_networkx(self) -> "nx.DiGraph":
        """``nx.DiGraph`` with node attrs ``kind``/``agent`` and edge attrs ``kind``/``key``/``join``."""
        return to_networkx(self)

    def to_mermaid(self) -> str:
        """Mermaid ``flowchart`` text of the graph."""
        return to_mermaid(self)

    def describe(self) -> str:
        """Text listing of nodes, edges and initial steps (what ``kvflow graph`` prints)."""
        return describe(self)

    def __repr__(self) -> str:
        return f"AgentStepGraph({self.name!r}, {len(self.nodes)} nodes, {len(self._agents)} agents)"

    def node_index(self, node: str, *, allow_start: bool = False) -> int:
        """``node``'s index in :attr:`index`; a :class:`WorkflowError` naming it when the graph has no
        such node (or it is START and ``allow_start`` is false: START never runs as a task)."""
        index = self.index.index_of.get(node)
        if node == START and not allow_start:
            raise WorkflowError(f"START ({START!r}) is not a node that runs; name a workflow node")
        if index is None:
            raise WorkflowError(f"workflow {self.name!r} has no node {node!r}")
        return index


# --------------------------------------------------------------------- validation
def _check_names(nodes: Mapping[str, Node], duplicates: Iterable[str]) -> None:
    for name in duplicates:
        raise WorkflowError(f"duplicate node name {name!r}: each node needs its own name")
    for name, node in nodes.items():
        if name in RESERVED_NAMES:
            raise WorkflowError(f"node name {name!r} is reserved (START/END); rename the node")
        if node.name != name:
            raise WorkflowError(f"node registered as {name!r} calls itself {node.name!r}")


def _check_edges(nodes, edges, joins, branches) -> None:
    def check(source: str, target: str, what: str, unknown_target: str = "unknown node") -> None:
        if source == END:
            raise WorkflowError(f"{what}: END cannot be the source of an edge")
        if target == START:
            raise WorkflowError(f"{what}: START cannot be the target of an edge")
        if source != START and source not in nodes:
            raise WorkflowError(f"{what}: unknown node {source!r}")
        if target != END and target not in nodes:
            raise WorkflowError(f"{what}: {unknown_target} {target!r}")

    for u, v in edges:
        check(u, v, f"edge {u!r} -> {v!r}")
    for members, v in joins:
        what = f"AND edge {list(members)!r} -> {v!r}"
        if len(set(members)) != len(members):
            raise WorkflowError(f"{what}: lists a source twice")
        for u in members:
            if u == START:
                raise WorkflowError(f"{what}: START cannot be a member of an AND-join")
            check(u, v, what)
    for b in branches:
        for v in b.targets:
            check(b.source, v, f"conditional edge {b.source!r} -> {v!r}", "path_map names unknown node")


def _agent_identities(nodes: Mapping[str, Node]) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    agents: dict[str, tuple[str, ...]] = {}
    systems: dict[str, str] = {}
    first: dict[str, str] = {}
    for name, node in nodes.items():
        if not node.is_llm:
            continue
        agent = node.agent
        if agent not in systems:  # every hint names its agent and lists all of them: check once here
            try:
                check_name(agent, f"agent identity of node {name!r}")
            except ValueError as exc:
                raise WorkflowError(str(exc)) from None
        if agent in systems and systems[agent] != node.system:
            raise WorkflowError(
                f"agent identity {agent!r} has two different system prompts (nodes "
                f"{first[agent]!r} and {name!r}); nodes sharing an agent must share its system prompt"
            )
        systems.setdefault(agent, node.system)
        first.setdefault(agent, name)
        agents[agent] = (*agents.get(agent, ()), name)
    if len(agents) > MAX_AGENTS:
        raise WorkflowError(f"{len(agents)} agent identities; a hint carries at most {MAX_AGENTS}")
    return agents, systems
