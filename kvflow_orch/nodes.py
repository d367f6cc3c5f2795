"""Node kinds of a workflow.

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
from typing import Any, Callable, Mapping, Union

from .errors import WorkflowError

__all__ = ["Sampling", "AgentNode", "CustomAgentNode", "FunctionNode", "Node", "render_prompt"]

PromptSpec = Union[str, Callable[[Mapping[str, Any]], str], None]


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of an LLM call: an agent's defaults, and what a serving engine receives
    (``backends.base.SamplingParams`` is this class)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # One stop string may be given bare, as in the OpenAI API; tuple("END") would be 3 stops.
        if not isinstance(self.stop, tuple):
            stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
            object.__setattr__(self, "stop", stop)
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    def as_request(self) -> dict[str, Any]:
        """These parameters as fields of an OpenAI-compatible request body."""
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if self.ignore_eos:  # an SGLang/kvflow extension: sent only when asked for
            body["ignore_eos"] = True
        return body


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
