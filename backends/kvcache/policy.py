"""Eviction policies: which evictable leaf goes first. Keys are compared with ``<``; the smallest
key is evicted first (min-heap, as in SGLang's ``EvictionStrategy``).

:func:`kvflow_key` is a pure function of a node's tags, the hint table and its last access, so the
SGLang plugin computes exactly the same order on its own tree nodes.
"""

from __future__ import annotations

import bisect
import inspect
import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Collection, Sequence

from .hints import AgentRef, HintTable
from .radix import Node, RadixTree

__all__ = [
    "EvictionPolicy", "LRUPolicy", "KVFlowPolicy", "BeladyPolicy", "kvflow_key", "node_steps",
    "TIER_UNTAGGED", "TIER_UNHINTED", "TIER_HINTED", "register_policy", "make_policy", "policy_names",
]

TIER_UNTAGGED = 0  # dynamic suffixes: evicted first
TIER_UNHINTED = 1  # fixed prefixes whose agents have steps None/inf, or lost protection to the cap
TIER_HINTED = 2    # fixed prefixes with finite steps: descending steps, then LRU


def node_steps(tags: Collection[AgentRef] | None, steps_of: Callable[[AgentRef], float]) -> float:
    """A node's steps: min over the agents whose fixed prefix runs through it (``inf`` if none)."""
    if not tags:
        return math.inf
    return min(steps_of(ref) for ref in tags)


def kvflow_key(tags: Collection[AgentRef] | None, hints: HintTable,
               last_access: float) -> tuple[int, float, int, float]:
    """The KVFlow eviction key of a node tagged with ``tags``; smaller is evicted first.

    Order: untagged nodes (dynamic suffixes), LRU among them; then tagged nodes without
    protection: steps ``None``/inf first, then agents the namespace cap unprotected, by
    descending steps; then protected tagged nodes by descending steps. Equal steps: the agent of
    the workflow that advanced last goes first (:meth:`HintTable.advanced`: concurrent workflows
    step side by side, so of equal steps the workflow that began its current step last reaches
    its agent last; not at 0 steps, where every workflow has reached its agent); then LRU
    (always within one workflow).
    """
    if not tags:
        return (TIER_UNTAGGED, 0.0, 0, last_access)
    steps = node_steps(tags, hints.steps)
    if steps == math.inf:
        raw = node_steps(tags, hints.raw_steps)
        return (TIER_UNHINTED, -raw, -_advanced(tags, hints, hints.raw_steps, raw), last_access)
    return (TIER_HINTED, -steps, -_advanced(tags, hints, hints.steps, steps), last_access)


def _advanced(tags: Collection[AgentRef], hints: HintTable, steps_of: Callable[[AgentRef], float],
              steps: float) -> int:
    """Of the tags that give a node its ``steps``, the earliest workflow advance (the least
    evictable reading); 0 without finite steps, and 0 at 0 steps: every such workflow has reached
    its agent already, so how late it advanced says nothing about which is needed first (it is its
    last call's arrival: of two looping agents the one sent last is, if anything, back first), and
    the tie goes to LRU."""
    if steps == math.inf or steps <= 0:
        return 0
    return min(hints.advanced(ref) for ref in tags if steps_of(ref) == steps)


class EvictionPolicy(ABC):
    """Orders eviction candidates. Keys are recomputed at every eviction (hints change between)."""

    name: str = ""

    @abstractmethod
    def key(self, node: Node) -> Any:
        """Sort key of an evictable node; the smallest is evicted first."""

    def on_request(self, tokens: Sequence[int]) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called once per admitted request, in arrival order (Belady advances its clock)."""

    def version(self) -> object:
        """Changes whenever keys may have *decreased* (between changes keys only grow: a touched
        or newly tagged node becomes less evictable). Eviction queues re-key on a change."""
        return 0

    def volatile(self, node: Node) -> bool:
        """Whether ``node``'s key may change when :meth:`version` changes."""
        return True


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def key(self, node: Node) -> Any:
        return node.last_access


class KVFlowPolicy(EvictionPolicy):
    name = "kvflow"

    def __init__(self, hints: HintTable) -> None:
        self.hints = hints

    def key(self, node: Node) -> Any:
        return kvflow_key(node.tags, self.hints, node.last_access)

    def version(self) -> object:
        return self.hints.version

    def volatile(self, node: Node) -> bool:
        return bool(node.tags)  # untagged keys are plain LRU: hints never move them


class BeladyPolicy(EvictionPolicy):
    """Offline oracle: evicts the node whose next use lies farthest in ``future`` (the complete
    sequence of requests that will be admitted, in order). For analysis and benchmarks only.

    A request "uses" a node when its tokens reach at least the node's first token.
    """

    name = "belady"

    def __init__(self, future: Sequence[Sequence[int]]) -> None:
        self._cursor = 0
        self._trie = RadixTree()
        self._uses: dict[int, list[int]] = {}
        self._trie.on_split = lambda upper, lower: self._uses.__setitem__(upper.id, list(self._uses[lower.id]))
        for index, tokens in enumerate(future):
            self._add(index, tuple(tokens))
        self._memo: dict[tuple[int, int], list[int]] = {}

    def _add(self, index: int, tokens: tuple[int, ...]) -> None:
        path, matched = self._trie.walk(tokens)
        for node in path:
            self._uses[node.id].append(index)
        if matched < len(tokens):
            parent = path[-1] if path else self._trie.root
            leaf = self._trie.add_child(parent, tokens[matched:])
            self._uses[leaf.id] = [index]

    def on_request(self, tokens: Sequence[int]) -> None:
        self._cursor += 1

    def version(self) -> object:
        return self._cursor

    def _users(self, node: Node) -> list[int]:
        chain = []
        cur = node.parent
        while cur is not None and cur.parent is not None:
            chain.append(cur.key)
            cur = cur.parent
        start = sum(len(k) for k in chain)
        memo_key = (node.id, start)
        users = self._memo.get(memo_key)
        if users is None:
            prefix = tuple(t for k in reversed(chain) for t in k) + node.key[:1]
            path, matched = self._trie.walk(prefix)
            users = self._uses[path[-1].id] if matched == len(prefix) else []
            self._memo[memo_key] = users
        return users

    def key(self, node: Node) -> Any:
        users = self._users(node)
        i = bisect.bisect_left(users, self._cursor)
        next_use = users[i] if i < len(users) else math.inf
        return (-next_use, node.last_access)


_POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": lambda hints: LRUPolicy(),
    "kvflow": lambda hints: KVFlowPolicy(hints),
    "belady": lambda hints, future=(): BeladyPolicy(future),
}
# Policies that need the whole future request sequence: a serving engine cannot run them.
_OFFLINE: set[str] = {"belady"}


def register_policy(name: str, factory: Callable[..., EvictionPolicy], *, offline: bool = False) -> None:
    """Add a policy: ``factory(hints, **options) -> EvictionPolicy``. ``offline`` marks an oracle
    that needs to be told the future (simulator and analysis only, never offered by a server)."""
    if not name or name in _POLICIES:
        raise ValueError(f"policy name {name!r} is empty or already registered")
    _POLICIES[name] = factory
    if offline:
        _OFFLINE.add(name)


def make_policy(name: str, hints: HintTable, **options: Any) -> EvictionPolicy:
    """Build a registered policy; an unknown name or an option the policy does not take (a typo
    such as ``futur`` would otherwise leave Belady blind) raises ValueError."""
    try:
        factory = _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(sorted(_POLICIES))}") from None
    try:
        inspect.signature(factory).bind(hints, **options)
    except TypeError as exc:
        raise ValueError(f"eviction policy {name!r} does not take options {sorted(options)}: {exc}") from None
    return factory(hints, **options)


def policy_names(*, online: bool = False) -> list[str]:
    """Registered policy names; ``online=True`` leaves out the offline oracles (what a serving
    engine, its config and its command line accept)."""
    return sorted(n for n in _POLICIES if not (online and n in _OFFLINE))
