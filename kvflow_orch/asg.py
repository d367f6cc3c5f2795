"""The Agent Step Graph (ASG): a validated, indexed view of a workflow.

:meth:`Workflow.compile` (and the LangGraph adapter) produce an :class:`AgentStepGraph`. It is
immutable; the per-instance state lives in a :class:`~kvflow_orch.tracker.StepTracker`
(``asg.tracker()``).

Trigger groups (issue 2): a plain edge ``u -> v`` is the group ``{u}`` of ``v``; a conditional edge
from ``r`` listing ``v`` is the group ``{r}`` of ``v``; an AND edge ``[u1..uk] -> v`` is one group
whose members carry *arrived* flags. START may be the source of plain and conditional edges and
nothing else; END may only be a target.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ._steps import TriggerIndex, solve_steps
from .builder import Branch
from .constants import END, RESERVED_NAMES, START
from .errors import WorkflowError
from .nodes import Node
from .protocol import MAX_AGENTS, check_name

if TYPE_CHECKING:
    import networkx as nx

    from .builder import Workflow
    from .tracker import StepTracker

__all__ = ["AgentStepGraph"]


class AgentStepGraph:
    """A validated workflow graph with its trigger groups precomputed.

    Build it with :meth:`from_workflow` / :meth:`Workflow.compile` or :meth:`from_langgraph`; the
    keyword constructor is the low-level entry both use (every argument is validated here, and
    every error is a :class:`WorkflowError` naming the node or edge at fault).

    Invariants: ``nodes`` excludes START/END; every node is reachable from START (its initial
    steps are finite); LLM nodes sharing an agent identity share one system prompt.
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

        self._names: tuple[str, ...] = tuple(self.nodes)
        self._index_of: dict[str, int] = {n: i for i, n in enumerate(self._names)}
        self._index_of[START] = len(self._names)
        self._build_index()
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
            duplicates=wf._duplicates,
        )

    @classmethod
    def from_langgraph(cls, graph: Any, agents: Mapping[str, str] | None = None) -> "AgentStepGraph":
        """Compile a LangGraph ``StateGraph`` (or compiled graph); ``agents``: node -> identity."""
        from .langgraph import compile_langgraph  # lazy: LangGraph is heavy to import

        return compile_langgraph(graph, agents)

    def _build_index(self) -> None:
        idx = self._index_of
        singles = [(idx[u], idx[v]) for u, targets in self._plain.items() for v in targets if v != END]
        for source, branches in self._branches.items():
            singles += [(idx[source], idx[v]) for b in branches for v in b.targets if v != END]
        ands = [(tuple(idx[m] for m in members), idx[t]) for members, t in self.joins if t != END]
        self._index = TriggerIndex.build(len(self._names) + 1, singles, ands)
        # Firing tables for the tracker: plain targets and declared conditional targets per index.
        self._plain_idx: tuple[tuple[int, ...], ...] = tuple(
            tuple(idx[v] for v in self._plain.get(n, ()) if v != END) for n in (*self._names, START)
        )
        self._goto_ok: tuple[frozenset[str], ...] = tuple(
            frozenset(v for b in self._branches.get(n, ()) for v in b.targets) for n in (*self._names, START)
        )
        self._agent_idx: dict[str, tuple[int, ...]] = {
            a: tuple(idx[n] for n in members) for a, members in self._agents.items()
        }

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
        self._require(node, allow_start=True)
        return self._plain.get(node, ())

    def branches_of(self, node: str) -> tuple[Branch, ...]:
        """Conditional edges leaving ``node`` (START allowed)."""
        self._require(node, allow_start=True)
        return self._branches.get(node, ())

    @property
    def agents(self) -> Mapping[str, tuple[str, ...]]:
        """Agent identity -> its LLM nodes, in declaration order."""
        return MappingProxyType(self._agents)

    def agent_of(self, node: str) -> str | None:
        """The agent identity of ``node``, or None for a plain Python node (or START/END)."""
        if node in RESERVED_NAMES:
            return None
        self._require(node)
        return self.nodes[node].agent

    def system_prompt(self, agent: str) -> str:
        """The fixed system prompt shared by the nodes of ``agent``."""
        try:
            return self._systems[agent]
        except KeyError:
            raise WorkflowError(f"unknown agent {agent!r}; agents: {sorted(self._systems)}") from None

    def tracker(self) -> "StepTracker":
        """A fresh :class:`StepTracker` for one instance of this workflow."""
        from .tracker import StepTracker

        return StepTracker(self)

    def to_networkx(self) -> "nx.DiGraph":
        """``nx.DiGraph`` with node attrs ``kind``/``agent`` and edge attrs ``kind``/``key``/``join``."""
        from ._export import to_networkx

        return to_networkx(self)

    def to_mermaid(self) -> str:
        """Mermaid ``flowchart`` text of the graph."""
        from ._export import to_mermaid

        return to_mermaid(self)

    def describe(self) -> str:
        """Text listing of nodes, edges and initial steps (what ``kvflow graph`` prints)."""
        from ._export import describe

        return describe(self)

    def __repr__(self) -> str:
        return f"AgentStepGraph({self.name!r}, {len(self.nodes)} nodes, {len(self._agents)} agents)"

    def _require(self, node: str, *, allow_start: bool = False) -> int:
        index = self._index_of.get(node)
        if node == START and not allow_start:
            raise WorkflowError(f"START ({START!r}) is not a node that runs; name a workflow node")
        if index is None:
            raise WorkflowError(f"workflow {self.name!r} has no node {node!r}")
        return index

    def _solve(self, active, arrived, pending) -> list[float]:
        return solve_steps(self._index, active, arrived, pending)


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
