"""Translate a LangGraph ``StateGraph`` into a kvflow :class:`~kvflow_orch.asg.AgentStepGraph`.

The translation reads the graph's builder (never ``get_graph()``, which drops AND-joins and
undeclared conditional edges) and replays it through the :class:`~kvflow_orch.builder.Workflow`
DSL, so a LangGraph graph and the same graph written in the DSL have identical steps:

* ``builder.edges`` -> plain edges; ``builder.waiting_edges`` -> AND edges;
* ``builder.branches[src][name].ends`` -> a conditional edge with that path_map;
* a node's ``ends`` (``-> Command[Literal[...]]``, ``destinations=`` as a tuple of targets or a
  dict of target -> edge label) -> a conditional edge from the node to those targets;
* a conditional edge whose targets are unknown (``ends is None``, or a node that returns an
  unannotated ``Command``) may lead anywhere: every node and END become targets;
* when nodes are still unreachable, what reaches them is invisible to the builder (a subgraph
  node's ``Command(graph=Command.PARENT)``, an error handler's ``Command(goto=...)``): subgraph
  nodes and nodes with an error handler may then lead anywhere, and a node nothing can reach is
  left out of the step graph (its requests carry no hint).

A graph LangGraph compiles is never refused for its shape; what had to be assumed is said in one
:class:`UndeclaredTargetsWarning` per graph.

LangGraph nodes carry no system prompt, so every node becomes an LLM-capable
:class:`~kvflow_orch.nodes.CustomAgentNode` with ``system=""`` and the agent identity from
``agents`` (default: the node name); ``agents[node] = None`` marks a node that calls no LLM.
Error-handler nodes are skipped.
"""

from __future__ import annotations

import typing
import warnings
from dataclasses import dataclass
from typing import Any, Hashable, Mapping

from langchain_core.runnables import RunnableSequence
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command

from ..asg import AgentStepGraph
from ..builder import Workflow
from ..constants import END, START
from ..errors import WorkflowError

__all__ = ["compile_langgraph", "compile_with_routes", "graph_routes", "Routes", "UndeclaredTargetsWarning"]


class UndeclaredTargetsWarning(UserWarning):
    """A LangGraph conditional edge does not declare where it may go."""


@dataclass(frozen=True)
class Routes:
    """Where a LangGraph node may route, in the order its branches run.

    ``branches`` lists ``(name, ends)`` per branch of the node, in the order LangGraph attaches
    them (so the i-th branch run of a node task is ``branches[i]``); ``ends`` maps a router's
    return value to a node, ``None`` when the router returns node names itself.
    ``command`` is True when the node may return a ``Command`` (declared or detected).
    """

    branches: tuple[tuple[str, Mapping[Hashable, str] | None], ...]
    command: bool
    first_branch_step: int = 3
    """The ``seq:step:K`` of the first branch run: LangGraph runs a node as one sequence of its
    body's steps (a chain of runnables counts each), one write step, then the branches."""

    def branch_at(self, seq_step: int) -> str | None:
        """The name of the branch run with tag ``seq:step:<seq_step>``, None for a body step."""
        i = seq_step - self.first_branch_step
        return self.branches[i][0] if 0 <= i < len(self.branches) else None


def _builder(graph: Any) -> Any:
    builder = graph if isinstance(graph, StateGraph) else getattr(graph, "builder", None)
    if not isinstance(builder, StateGraph):
        raise WorkflowError(
            f"expected a LangGraph StateGraph or a compiled StateGraph, got {type(graph).__name__} "
            f"(the functional API (@entrypoint) has no static graph to compile)"
        )
    return builder


def _node_names(builder: Any) -> list[str]:
    return [n for n, spec in builder.nodes.items() if not getattr(spec, "is_error_handler", False)]


def _returns_command(spec: Any) -> bool:
    """Whether a node without declared destinations may still return a ``Command``.

    True for a bare ``-> Command`` annotation, and for an unannotated function whose code refers to
    ``Command``: LangGraph cannot see either statically, but both route at run time.
    """
    func = getattr(spec.runnable, "func", None) or getattr(spec.runnable, "afunc", None)
    if func is None:
        return False
    try:
        ret = typing.get_type_hints(func).get("return")
    except Exception:
        ret = getattr(func, "__annotations__", {}).get("return")
    if ret is not None:
        return ret is Command or typing.get_origin(ret) is Command
    code = getattr(func, "__code__", None)
    return code is not None and _code_mentions(code, "Command")


def _code_mentions(code: Any, name: str) -> bool:
    if name in code.co_names:
        return True
    return any(_code_mentions(c, name) for c in code.co_consts if hasattr(c, "co_names"))


def _body_steps(spec: Any) -> int:
    if spec is None:  # START: its sequence is only the writes
        return 0
    runnable = spec.runnable
    # LangGraph flattens a RunnableSequence, and its own internal RunnableSeq, into the node's steps.
    if isinstance(runnable, RunnableSequence) or type(runnable).__name__ == "RunnableSeq":
        return len(runnable.steps)
    return 1


def graph_routes(graph: Any) -> dict[str, Routes]:
    """The :class:`Routes` of every node of ``graph`` (START included) that can route."""
    builder = _builder(graph)
    routes: dict[str, Routes] = {}
    for node in [START, *_node_names(builder)]:
        branches = tuple(
            (name, None if spec.ends is None else dict(spec.ends))
            for name, spec in builder.branches.get(node, {}).items()
        )
        spec = builder.nodes.get(node)
        command = spec is not None and bool(spec.ends or _returns_command(spec))
        if branches or command:
            routes[node] = Routes(branches, command, _body_steps(spec) + 2)
    return routes


class _Degraded:
    """What the translation had to guess, reported in one warning per graph."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def warn(self, graph_name: str) -> None:
        if self.notes:
            warnings.warn(
                f"LangGraph graph {graph_name!r}: kvflow cannot see every target statically, so it "
                f"assumes {'; '.join(self.notes)} (steps-to-execution get less precise there)",
                UndeclaredTargetsWarning,
                stacklevel=4,
            )


def _is_subgraph(spec: Any) -> bool:
    return isinstance(spec.runnable, Pregel) or isinstance(getattr(spec.runnable, "bound", None), Pregel)


def _reachable(plain: Any, joins: Any, cond: Mapping[str, list[str]]) -> set[str]:
    reach = {START}
    while True:
        before = len(reach)
        reach |= {t for s, t in plain if s in reach}
        reach |= {t for sources, t in joins if all(s in reach for s in sources)}
        reach |= {t for s, targets in cond.items() if s in reach for t in targets}
        if len(reach) == before:
            return reach


def _unroutable(source: str) -> Any:
    def route(state: Any) -> Any:
        raise WorkflowError(
            f"node {source!r} routes with a LangGraph Command; only LangGraph can run it"
        )

    return route


def compile_langgraph(graph: Any, agents: Mapping[str, str | None] | None = None) -> AgentStepGraph:
    """Compile a LangGraph ``StateGraph`` (or a compiled graph) into an Agent Step Graph.

    ``agents`` maps node -> agent identity (default: the node name; ``None``: the node calls no
    LLM). Raises :class:`WorkflowError` for anything that is not a StateGraph, for ``agents`` naming
    unknown nodes, and for every validation error of :meth:`Workflow.compile`.
    """
    return compile_with_routes(graph, agents)[0]


def compile_with_routes(
    graph: Any, agents: Mapping[str, str | None] | None = None
) -> tuple[AgentStepGraph, dict[str, Routes]]:
    """:func:`compile_langgraph` and the :func:`graph_routes` it read (instrument needs both)."""
    builder = _builder(graph)
    names = _node_names(builder)
    agents = dict(agents or {})
    unknown = sorted(set(agents) - set(names))
    if unknown:
        raise WorkflowError(f"agents names node(s) {unknown} that the LangGraph graph lacks (nodes: {names})")

    graph_name = getattr(graph, "name", None) or "langgraph"
    keep = set(names) | {START, END}
    plain = [(s, t) for s, t in sorted(builder.edges) if s in keep and t in keep]
    joins = [(tuple(sources), t) for sources, t in sorted(builder.waiting_edges) if t in keep]
    anywhere = [*names, END]
    all_routes = graph_routes(builder)
    degraded = _Degraded()

    # Conditional targets per source: (source, path function, targets) in LangGraph's order.
    cond: list[tuple[str, Any, Any]] = []
    undeclared: list[str] = []
    for node, routes in all_routes.items():
        for (branch_name, ends), spec in zip(routes.branches, builder.branches[node].values(), strict=True):
            if ends is None:
                undeclared.append(f"router {branch_name!r} of {node!r}")
            cond.append((node, spec.path.invoke, anywhere if ends is None else ends))
        if routes.command:
            ends = builder.nodes[node].ends
            if ends:  # destinations=: a dict maps target -> edge label, a tuple lists targets
                targets = list(ends)
            else:
                undeclared.append(f"the Command of {node!r}")
                targets = anywhere
            cond.append((node, _unroutable(node), targets))
    if undeclared:
        degraded.notes.append(
            f"{', '.join(undeclared)} may go to any node (declare targets with a path_map, "
            f"Literal[...] return types, Command[Literal[...]] or destinations=)"
        )

    def targets_by_source() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for source, _, targets in cond:
            out.setdefault(source, []).extend(targets.values() if isinstance(targets, dict) else targets)
        return out

    reach = _reachable(plain, joins, targets_by_source())
    if set(names) - reach:
        # Reached at run time by what the builder does not record: Command.PARENT from inside a
        # subgraph node, an error handler's Command(goto=...), Send. Those nodes may go anywhere.
        handles_all = any(n.startswith("__default_error_handler") for n in builder.nodes)
        dynamic = [
            n
            for n in names
            if handles_all or _is_subgraph(builder.nodes[n]) or getattr(builder.nodes[n], "error_handler_node", None)
        ]
        for node in dynamic:
            cond.append((node, _unroutable(node), anywhere))
        if dynamic:
            degraded.notes.append(f"{dynamic} (subgraph hand-offs, error handlers) may go to any node")
        reach = _reachable(plain, joins, targets_by_source())
    dropped = [n for n in names if n not in reach]
    if dropped:
        degraded.notes.append(f"{dropped}, which no edge reaches, are not tracked")
        keep -= set(dropped)
        names = [n for n in names if n not in dropped]
        plain = [(s, t) for s, t in plain if s in keep and t in keep]
        joins = [(ss, t) for ss, t in joins if t in keep and all(s in keep for s in ss)]
        cond = [(s, f, _only(t, keep)) for s, f, t in cond if s in keep]
        cond = [c for c in cond if c[2]]

    wf = Workflow(graph_name)
    for name in names:
        spec = builder.nodes[name]
        agent = agents.get(name, name)
        if agent is None:
            wf.add_node(name, spec.runnable.invoke)
        elif isinstance(agent, str) and agent:
            wf.agent(name, system="", agent=agent)(spec.runnable.invoke)
        else:
            raise WorkflowError(f"agents[{name!r}] must be a non-empty string or None, got {agent!r}")
    for source, target in plain:
        wf.add_edge(source, target)
    for sources, target in joins:
        wf.add_edge(list(sources), target)
    for source, path, targets in cond:
        wf.add_conditional_edges(source, path, targets)
    degraded.warn(graph_name)
    return wf.compile(), all_routes


def _only(targets: Any, keep: set[str]) -> Any:
    if isinstance(targets, dict):
        return {k: v for k, v in targets.items() if v in keep}
    return [t for t in targets if t in keep]
