"""Views of an Agent Step Graph for people and tools: networkx, Mermaid and a text listing."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

from .constants import END, START
from .nodes import AgentNode, CustomAgentNode

if TYPE_CHECKING:
    import networkx as nx

    from .asg import AgentStepGraph

__all__ = ["EdgeView", "edges", "node_kind", "to_networkx", "to_mermaid", "describe"]


class EdgeView(NamedTuple):
    """One declared edge: ``kind`` is ``plain``, ``conditional`` (with its path_map ``keys``) or
    ``and`` (with ``join``, the index into ``asg.joins``)."""

    source: str
    target: str
    kind: str
    keys: tuple[Any, ...] = ()
    join: int | None = None


def edges(asg: "AgentStepGraph") -> Iterator[EdgeView]:
    """Every declared edge in declaration order per source: plain, conditional, then AND."""
    for source in (START, *asg.nodes):
        for target in asg.plain_targets(source):
            yield EdgeView(source, target, "plain")
        for branch in asg.branches_of(source):
            for target in branch.targets:
                keys = tuple(k for k, t in branch.path_map.items() if t == target)
                yield EdgeView(source, target, "conditional", keys)
    for join, (members, target) in enumerate(asg.joins):
        for member in members:
            yield EdgeView(member, target, "and", join=join)


def node_kind(asg: "AgentStepGraph", name: str) -> str:
    """``start``, ``end``, ``agent`` (template LLM node), ``custom_agent`` or ``function``."""
    if name in (START, END):
        return "start" if name == START else "end"
    node = asg.nodes[name]
    if isinstance(node, AgentNode):
        return "agent"
    return "custom_agent" if isinstance(node, CustomAgentNode) else "function"


def to_networkx(asg: "AgentStepGraph") -> "nx.DiGraph":
    """A ``DiGraph`` including START and END. Node attrs: ``kind``, ``agent`` (None when not an LLM
    node). Edge attrs: ``kind`` and, for conditional edges, ``key`` (the path_map key, or a tuple
    when several keys lead to one target); for AND edges, ``join``. A pair joined by several
    declared edges keeps the first one listed by :func:`edges`."""
    import networkx as nx

    graph = nx.DiGraph(name=asg.name)
    for name in (START, *asg.nodes, END):
        graph.add_node(name, kind=node_kind(asg, name), agent=asg.agent_of(name))
    for e in edges(asg):
        if graph.has_edge(e.source, e.target):
            continue
        attrs: dict[str, Any] = {"kind": e.kind}
        if e.kind == "conditional":
            attrs["key"] = e.keys[0] if len(e.keys) == 1 else e.keys
        elif e.kind == "and":
            attrs["join"] = e.join
        graph.add_edge(e.source, e.target, **attrs)
    return graph


_ARROWS = {"plain": "-->", "conditional": "-.->", "and": "==>"}


def to_mermaid(asg: "AgentStepGraph") -> str:
    """Mermaid ``flowchart TD``: plain ``-->``, conditional ``-.->|key|``, AND ``==>|AND join N|``."""
    ids = {name: f"n{i}" for i, name in enumerate(asg.nodes)}
    # "end" is a Mermaid keyword, so the sentinels get ids that cannot clash with n<i>.
    ids[START], ids[END] = "start_node", "end_node"
    lines = ["flowchart TD", f'    start_node(["{START}"])', f'    end_node(["{END}"])']
    for name in asg.nodes:
        agent = asg.agent_of(name)
        label = name if agent in (None, name) else f"{name}<br/>agent: {agent}"
        shape = '["{}"]' if agent is not None else '[["{}"]]'
        lines.append(f"    {ids[name]}{shape.format(_quote(label))}")
    for e in edges(asg):
        label = ""
        if e.kind == "conditional":
            label = "|" + _quote(", ".join(map(str, e.keys))) + "|"
        elif e.kind == "and":
            label = f"|AND join {e.join}|"
        lines.append(f"    {ids[e.source]} {_ARROWS[e.kind]}{label} {ids[e.target]}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return text.replace('"', "#quot;").replace("|", "#124;")


def describe(asg: "AgentStepGraph") -> str:
    """The listing ``kvflow graph`` prints: nodes with kind/agent, edges with kinds, initial steps."""
    width = max((len(n) for n in (START, *asg.nodes)), default=8)
    out = [f"workflow {asg.name!r}: {len(asg.nodes)} nodes, {len(asg.agents)} agents, {len(asg.joins)} AND-joins",
           "", "nodes:"]
    for name in asg.nodes:
        agent = asg.agent_of(name)
        out.append(f"  {name:<{width}}  {node_kind(asg, name):<12}  {f'agent={agent}' if agent else ''}".rstrip())
    out += ["", "edges:"]
    for e in edges(asg):
        detail = {"plain": "", "conditional": f"  keys={list(e.keys)}", "and": f"  join={e.join}"}[e.kind]
        out.append(f"  {e.source:>{width}} -> {e.target:<{width}}  {e.kind}{detail}")
    out += ["", "initial steps-to-execution:"]
    for name, steps in asg.tracker().steps().items():
        out.append(f"  {name:<{width}}  {'inf' if steps == math.inf else steps}")
    return "\n".join(out) + "\n"
