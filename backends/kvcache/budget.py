"""The prefetch budget: how much device room a prefetch for an agent may take, for any tree.

The rule (one for the brain's own tree and for SGLang's): a prefetch of an agent due in ``steps``
may use the free device tokens, plus the tokens of device nodes taken in eviction order, from the
first until the first node whose eviction would remove something as urgent as that agent (a node
on the fixed prefix of an agent with steps <= ``steps``), and no further than the tokens it needs.
Eviction never removes a more urgent prefix to make room for a prefetch, and a prefetched prefix
is itself evicted before any more urgent one.

A tree hands the rule its eviction candidates as an iterator in policy order (the brain's lazy
:class:`~.leafqueue.LeafQueue`; SGLang's evictable device leaves in a heap); the rule stops reading
at the bar or once the need is met, so the walk is bounded by what the prefetch needs, never the
whole tree.
"""

from __future__ import annotations

from typing import Callable, Collection, Iterable, TypeVar

from .hints import AgentRef
from .policy import node_steps

__all__ = ["prefetch_room", "take_in_order"]

T = TypeVar("T")


def take_in_order(order: Iterable[T], need: int, size: Callable[[T], int],
                  stop: Callable[[T], bool] | None = None) -> tuple[list[T], int]:
    """Candidates from ``order`` until their sizes reach ``need``, ending early at the first one
    ``stop`` refuses; returns them and their total size (less than ``need`` when ended early)."""
    taken: list[T] = []
    got = 0
    if need <= 0:
        return taken, got
    for node in order:
        if stop is not None and stop(node):
            break
        taken.append(node)
        got += size(node)
        if got >= need:
            break
    return taken, got


def prefetch_room(order: Iterable[T], need: int, steps: float, *, size: Callable[[T], int],
                  tags: Callable[[T], Collection[AgentRef] | None],
                  steps_of: Callable[[AgentRef], float]) -> tuple[list[T], int]:
    """The victims a prefetch for an agent due in ``steps`` may take to find ``need`` device tokens
    beyond the free ones, and their tokens (fewer than ``need``: the room is not there)."""
    return take_in_order(order, need, size, stop=lambda node: node_steps(tags(node), steps_of) <= steps)
