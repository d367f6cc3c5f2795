"""The workflow builder: a LangGraph-style DSL that records nodes and edges.

The builder only records; :meth:`Workflow.compile` validates everything and returns an
:class:`~kvflow_orch.asg.AgentStepGraph`. Errors that can be detected at the call site (a
conditional edge with no way to know its targets, a bad argument type) are raised immediately.

Example::

    wf = Workflow("review")
    wf.add_agent("writer", system=WRITER, prompt="Write about {topic}", output="draft")
    wf.add_agent("critic", system=CRITIC, prompt="Review:\\n{draft}", output="review")
    wf.add_edge(START, "writer")
    wf.add_edge("writer", "critic")
    wf.add_conditional_edges("critic", route, {"again": "writer", "done": END})
    asg = wf.compile()
"""

from __future__ import annotations

import typing
from typing import Any, Callable, Hashable, Literal, Mapping, Sequence, get_args, get_origin

from .asg import AgentStepGraph
from .errors import WorkflowError
from .nodes import AgentNode, Branch, CustomAgentNode, FunctionNode, Node, PromptSpec
from .protocol.sampling import Sampling

__all__ = ["Workflow"]

Reducer = Callable[[Any, Any], Any]


class Workflow:
    """Builder of a multi-agent workflow graph.

    ``state`` may be a ``TypedDict`` whose ``Annotated[T, reducer]`` keys declare reducers (as in
    LangGraph); ``reducers`` maps keys to reducers explicitly. Keys without a reducer are
    last-write-wins, and two concurrent writes to such a key are an error at run time.
    """

    def __init__(
        self,
        name: str,
        *,
        state: type | None = None,
        reducers: Mapping[str, Reducer] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise WorkflowError("a workflow needs a non-empty string name")
        self.name = name
        self.nodes: dict[str, Node] = {}
        self.edges: list[tuple[str, str]] = []
        self.joins: list[tuple[tuple[str, ...], str]] = []
        self.branches: list[Branch] = []
        self.reducers: dict[str, Reducer] = {**_reducers_from_schema(state), **(reducers or {})}
        self.duplicates: list[str] = []  # names added twice; compile() reports them with every other problem

    # ----------------------------------------------------------------- nodes
    def add_agent(
        self,
        name: str,
        system: str,
        prompt: PromptSpec = None,
        *,
        agent: str | None = None,
        output: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
    ) -> "Workflow":
        """Add a template LLM node (fixed ``system`` prompt, dynamic ``prompt``)."""
        if not isinstance(system, str):
            raise WorkflowError(f"agent node {name!r}: system must be a string (the fixed prompt)")
        if prompt is not None and not (isinstance(prompt, str) or callable(prompt)):
            raise WorkflowError(
                f"agent node {name!r}: prompt must be a format string or a callable state -> str"
            )
        sampling = _sampling(name, max_tokens, temperature, top_p, seed, stop)
        node = AgentNode(name, system, prompt, agent or name, output, sampling)
        return self._add(node)

    def agent(
        self,
        name: str | None = None,
        *,
        system: str,
        agent: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator for a custom agent ``async def f(ctx, state) -> dict`` calling ``ctx.llm``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            node_name = name or fn.__name__
            sampling = _sampling(node_name, max_tokens, temperature, top_p, seed, ())
            self._add(CustomAgentNode(node_name, fn, system, agent or node_name, sampling))
            return fn

        return register

    def add_node(self, name: str, fn: Callable[..., Any]) -> "Workflow":
        """Add a plain Python node ``fn(state) -> dict | None`` (sync or async); it calls no LLM."""
        if not callable(fn):
            raise WorkflowError(f"node {name!r}: expected a callable, got {type(fn).__name__}")
        return self._add(FunctionNode(name, fn))

    def _add(self, node: Node) -> "Workflow":
        if not isinstance(node.name, str) or not node.name:
            raise WorkflowError(f"node names must be non-empty strings, got {node.name!r}")
        if node.name in self.nodes:
            # Recorded rather than raised so compile() reports every problem the same way.
            self.duplicates.append(node.name)
        else:
            self.nodes[node.name] = node
        return self

    # ----------------------------------------------------------------- edges
    def add_edge(self, source: str | Sequence[str], target: str) -> "Workflow":
        """``a -> b`` (sequential), or ``[a, b] -> c`` (AND-join: ``c`` waits for all sources)."""
        if isinstance(source, str):
            self.edges.append((source, target))
        else:
            sources = tuple(source)
            if not sources or not all(isinstance(s, str) for s in sources):
                raise WorkflowError(f"AND edge to {target!r}: sources must be a non-empty list of names")
            if len(sources) == 1:
                self.edges.append((sources[0], target))
            else:
                self.joins.append((sources, target))
        return self

    def add_conditional_edges(
        self,
        source: str,
        router: Callable[[Mapping[str, Any]], Any],
        path_map: Mapping[Hashable, str] | Sequence[str] | None = None,
    ) -> "Workflow":
        """``router(state)`` picks one target (OR), or a list of them (fan-out).

        Targets come from ``path_map`` (a dict key -> node, or a list of nodes), else from a
        ``Literal[...]`` return annotation of ``router``.
        """
        if not callable(router):
            raise WorkflowError(f"conditional edge from {source!r}: router must be callable")
        if path_map is None:
            literal = _literal_targets(router)
            if literal is None:
                raise WorkflowError(
                    f"conditional edge from {source!r}: cannot tell which nodes the router "
                    f"{getattr(router, '__name__', router)!r} may choose. Pass path_map (a dict "
                    f"{{key: node}} or a list of nodes), or annotate its return type as "
                    f"Literal['node_a', 'node_b', ...]"
                )
            mapping: dict[Hashable, str] = {t: t for t in literal}
        elif isinstance(path_map, Mapping):
            mapping = dict(path_map)
        elif isinstance(path_map, (list, tuple)):
            mapping = {t: t for t in path_map}
        else:
            raise WorkflowError(
                f"conditional edge from {source!r}: path_map must be a dict or a list of node names"
            )
        if not mapping:
            raise WorkflowError(f"conditional edge from {source!r}: path_map is empty")
        self.branches.append(Branch(source, router, mapping))
        return self

    def compile(self) -> AgentStepGraph:
        """Validate the graph and return its :class:`AgentStepGraph`."""
        return AgentStepGraph.from_workflow(self)


def _sampling(name: str, max_tokens: int, temperature: float, top_p: float, seed, stop) -> Sampling:
    try:
        return Sampling(max_tokens, float(temperature), float(top_p), seed, stop)
    except (TypeError, ValueError) as exc:
        raise WorkflowError(f"agent node {name!r}: {exc}") from None


def _literal_targets(router: Callable[..., Any]) -> tuple[str, ...] | None:
    """Targets from a ``-> Literal[...]`` (or ``list[Literal[...]]``) return annotation."""
    target = router if hasattr(router, "__annotations__") else router.__call__
    try:
        hints = typing.get_type_hints(target)
    except Exception:
        hints = getattr(target, "__annotations__", {}) or {}
    ret = hints.get("return")
    if ret is None:
        return None
    if get_origin(ret) in (list, tuple, Sequence) and get_args(ret):
        ret = get_args(ret)[0]
    if get_origin(ret) is Literal:
        return tuple(str(a) for a in get_args(ret))
    return None


def _reducers_from_schema(schema: type | None) -> dict[str, Reducer]:
    if schema is None:
        return {}
    try:
        hints = typing.get_type_hints(schema, include_extras=True)
    except Exception as exc:
        raise WorkflowError(f"cannot read the state schema {schema!r}: {exc}") from None
    reducers: dict[str, Reducer] = {}
    for key, hint in hints.items():
        if get_origin(hint) is typing.Annotated:
            for meta in get_args(hint)[1:]:
                if callable(meta):
                    reducers[key] = meta
                    break
    return reducers
