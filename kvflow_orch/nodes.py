"""Vocabulary of a workflow graph: its node kinds and conditional edges.

Three kinds exist; each is a frozen record the builder creates and the runtime executes:

* :class:`AgentNode` — a template LLM call: fixed ``system`` prompt + dynamic ``prompt`` rendered
  from the state, reply written to ``output``. Runs without user code.
* :class:`CustomAgentNode` — ``async def f(ctx, state) -> dict`` that calls ``ctx.llm(...)`` itself.
* :class:`FunctionNode` — plain Python (sync or async) ``f(state) -> dict | None``; no LLM, no agent.

Invariant: every LLM node has an ``agent`` identity (its cache identity, default its name); nodes
sharing an identity share the same ``system`` prompt (checked at ``compile()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Union

from .errors import WorkflowError
from .protocol.sampling import Sampling

__all__ = ["AgentNode", "CustomAgentNode", "FunctionNode", "Node", "Branch", "render_prompt"]

PromptSpec = Union[str, Callable[[Mapping[str, Any]], str], None]


@dataclass(frozen=True)
class AgentNode:
    name: str
    system: str
    prompt: PromptSpec = None
    agent: str = ""
    output: str | None = None
    sampling: Sampling = field(default_factory=Sampling)

    @property
    def is_llm(self) -> bool:
        return True


@dataclass(frozen=True)
class CustomAgentNode:
    name: str
    fn: Callable[..., Any]
    system: str
    agent: str = ""
    sampling: Sampling = field(default_factory=Sampling)

    @property
    def is_llm(self) -> bool:
        return True


@dataclass(frozen=True)
class FunctionNode:
    name: str
    fn: Callable[..., Any]

    @property
    def agent(self) -> None:
        return None

    @property
    def is_llm(self) -> bool:
        return False


Node = Union[AgentNode, CustomAgentNode, FunctionNode]


@dataclass(frozen=True)
class Branch:
    """A conditional edge: ``router(state)`` returns a key of ``path_map`` (or a list of keys)."""

    source: str
    router: Callable[[Mapping[str, Any]], Any]
    path_map: Mapping[Hashable, str]

    @property
    def targets(self) -> tuple[str, ...]:
        """The distinct nodes ``path_map`` leads to, in declaration order (END included)."""
        return tuple(dict.fromkeys(self.path_map.values()))


def render_prompt(node: AgentNode, state: Mapping[str, Any]) -> str:
    """The dynamic part of an :class:`AgentNode`'s call for ``state``.

    A format string sees the state's keys; a callable receives the state. ``None`` renders as an
    empty string (the agent then speaks from its fixed prompt alone).
    """
    spec = node.prompt
    if spec is None:
        return ""
    if callable(spec):
        text = spec(state)
        if not isinstance(text, str):
            raise WorkflowError(
                f"prompt callable of node {node.name!r} returned {type(text).__name__}, expected str"
            )
        return text
    try:
        return spec.format_map(state)
    except KeyError as exc:
        raise WorkflowError(
            f"prompt of node {node.name!r} uses {{{exc.args[0]}}} but the state has no key "
            f"{exc.args[0]!r} (keys: {sorted(state)})"
        ) from None
