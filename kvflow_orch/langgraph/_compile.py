"""Translate a LangGraph ``StateGraph`` into a kvflow :class:`~kvflow_orch.asg.AgentStepGraph`.

The translation reads the graph's builder (never ``get_graph()``, which drops AND-joins and
undeclared conditional edges) and replays it through the :class:`~kvflow_orch.builder.Workflow`
DSL, so a LangGraph graph and the same graph written in the DSL have identical steps:

* ``builder.edges`` -> plain edges; ``builder.waiting_edges`` -> AND edges;
* ``builder.branches[src][name].ends`` -> a conditional edge with that path_map;
* a node's ``ends`` (``-> Command[Literal[...]]`` or ``destinations=``) -> a conditional edge from
  the node whose targets are those destinations;
* a conditional edge whose targets are unknown (``ends is None``, or a node that returns an
  unannotated ``Command``) may lead anywhere: every node and END become targets, with a warning
  that names the edge and says how to declare it.

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

from ..builder import Workflow
from ..constants import END, START
from ..errors import WorkflowError

if typing.TYPE_CHECKING:
    from ..asg import AgentStepGraph

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


def _builder(graph: Any) -> Any:
    from langgraph.graph import StateGraph

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
    from langgraph.types import Command

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
            routes[node] = Routes(branches, command)
    return routes


def _warn_undeclared(edge: str, how: str) -> None:
    warnings.warn(
        f"LangGraph conditional edge {edge} does not declare its targets, so kvflow assumes it may "
        f"go to any node (steps-to-execution get less precise). {how}",
        UndeclaredTargetsWarning,
        stacklevel=4,
    )


def _unroutable(source: str) -> Any:
    def route(state: Any) -> Any:
        raise WorkflowError(
            f"node {source!r} routes with a LangGraph Command; only LangGraph can run it"
        )

    return route


def compile_langgraph(graph: Any, agents: Mapping[str, str | None] | None = None) -> "AgentStepGraph":
    """Compile a LangGraph ``StateGraph`` (or a compiled graph) into an Agent Step Graph.

    ``agents`` maps node -> agent identity (default: the node name; ``None``: the node calls no
    LLM). Raises :class:`WorkflowError` for anything that is not a StateGraph, for ``agents`` naming
    unknown nodes, and for every validation error of :meth:`Workflow.compile`.
    """
    return compile_with_routes(graph, agents)[0]


def compile_with_routes(
    graph: Any, agents: Mapping[str, str | None] | None = None
) -> "tuple[AgentStepGraph, dict[str, Routes]]":
    """:func:`compile_langgraph` and the :func:`graph_routes` it read (instrument needs both)."""
    builder = _builder(graph)
    names = _node_names(builder)
    agents = dict(agents or {})
    unknown = sorted(set(agents) - set(names))
    if unknown:
        raise WorkflowError(f"agents names node(s) {unknown} that the LangGraph graph lacks (nodes: {names})")

    wf = Workflow(getattr(graph, "name", None) or "langgraph")
    for name in names:
        spec = builder.nodes[name]
        agent = agents.get(name, name)
        if agent is None:
            wf.add_node(name, spec.runnable.invoke)
        elif isinstance(agent, str) and agent:
            wf.agent(name, system="", agent=agent)(spec.runnable.invoke)
        else:
            raise WorkflowError(f"agents[{name!r}] must be a non-empty string or None, got {agent!r}")

    keep = set(names) | {START, END}
    for source, target in sorted(builder.edges):
        if source in keep and target in keep:
            wf.add_edge(source, target)
    for sources, target in sorted(builder.waiting_edges):
        if target in keep:
            wf.add_edge(list(sources), target)

    anywhere = [*names, END]
    all_routes = graph_routes(builder)
    for node, routes in all_routes.items():
        for (branch_name, ends), spec in zip(routes.branches, builder.branches[node].values()):
            if ends is None:
                _warn_undeclared(
                    f"{node!r} -> ? (router {branch_name!r})",
                    "Pass a path_map to add_conditional_edges or annotate the router's return type "
                    "as Literal['node_a', 'node_b', ...].",
                )
                wf.add_conditional_edges(node, spec.path.invoke, anywhere)
            else:
                wf.add_conditional_edges(node, spec.path.invoke, ends)
        if routes.command:
            ends = builder.nodes[node].ends
            if ends:
                targets = list(ends.values()) if isinstance(ends, dict) else list(ends)
            else:
                _warn_undeclared(
                    f"{node!r} -> ? (Command)",
                    f"Annotate node {node!r} as returning Command[Literal['node_a', ...]] or pass "
                    f"add_node(..., destinations=(...)).",
                )
                targets = anywhere
            wf.add_conditional_edges(node, _unroutable(node), targets)
    return wf.compile(), all_routes
