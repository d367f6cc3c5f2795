"""Radix tree over token ids (one token per slot), SGLang-style, with two-tier slot ownership.

The tree is structure only: :class:`~backends.kvcache.cache.KVCache` decides which slots a node owns
and moves nodes between tiers. Invariants (checked by ``KVCache.check_integrity``):

* every non-root node has a non-empty ``key``; siblings differ in their first token;
* ``device`` / ``host`` are ``None`` or a list of exactly ``len(key)`` slot ids;
* a node with device slots has a parent with device slots (or the root): the device tier is a
  rooted subtree, so a path's device tokens are a prefix of it;
* ``lock_ref`` of a node = number of lock holders at it or below it (locks count up the path);
* a split keeps every attribute on both halves: tags, states, lock counts, last access.

Salted keys (:func:`salted_key`, a request's ``cache_salt``): the first token of a salted prompt is
replaced by a negative number drawn from the salt, which no token id and no other salt produces.
Sharing in a radix tree starts at the root, so prompts under different salts (or none) share no
node, whatever follows; under one salt they share as before. The tree never reads token ids as
anything but keys, and the model is fed the real ids, so outputs do not change.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from typing import Callable, Iterator, Sequence

from .hints import AgentRef
from .segment import common_prefix_len

__all__ = ["NodeState", "Node", "RadixTree", "salted_key"]


def salted_key(tokens: Sequence[int], salt: str | None) -> tuple[int, ...]:
    """The tree key of ``tokens`` under ``salt`` (``None``: the tokens themselves)."""
    tokens = tuple(tokens)
    if salt is None or not tokens:
        return tokens
    digest = hashlib.blake2b(salt.encode(), digest_size=16, person=b"kvflow-salt").digest()
    return (-1 - int.from_bytes(digest, "big"), *tokens[1:])


class NodeState(enum.Enum):
    DEVICE = "device"          # device slots only
    HOST = "host"              # host slots only
    BOTH = "both"              # device and host copies, identical
    LOADING = "loading"        # host -> device copy in flight (device slots allocated, not valid yet)
    OFFLOADING = "offloading"  # device -> host copy in flight (host slots allocated, not valid yet)
    ROOT = "root"


class Node:
    """One radix node. ``id`` is unique for the life of the cache and never reused."""

    __slots__ = (
        "id", "key", "parent", "children", "device", "host", "lock_ref", "last_access",
        "loading", "offloading", "tags", "prefetched",
    )

    def __init__(self, node_id: int, key: tuple[int, ...], parent: Node | None) -> None:
        self.id = node_id
        self.key = key
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.device: list[int] | None = None
        self.host: list[int] | None = None
        self.lock_ref = 0
        self.last_access = 0
        self.loading: int | None = None     # id of the load task moving it to device
        self.offloading: int | None = None  # id of the offload task writing its host copy
        self.tags: set[AgentRef] | None = None  # agents whose fixed prefix runs through it
        self.prefetched = False               # loaded by a prefetch, not hit since

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"Node(id={self.id}, len={len(self.key)}, state={self.state.value}, lock={self.lock_ref})"

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def state(self) -> NodeState:
        if self.parent is None:
            return NodeState.ROOT
        if self.loading is not None:
            return NodeState.LOADING
        if self.offloading is not None:
            return NodeState.OFFLOADING
        if self.device is not None:
            return NodeState.BOTH if self.host is not None else NodeState.DEVICE
        return NodeState.HOST


class RadixTree:
    """Structure of the tree: walk, split, add and remove nodes; no slot policy."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.root = Node(0, (), None)
        self.nodes: dict[int, Node] = {0: self.root}
        self.on_split: Callable[[Node, Node], None] | None = None
        """Called as ``on_split(upper, lower)`` after a split (the cache re-registers tasks)."""

    def walk(self, tokens: Sequence[int]) -> tuple[list[Node], int]:
        """Follow ``tokens`` from the root, splitting the last node at a partial match.

        Returns the path (root excluded) and the matched length; the path's keys concatenate to
        exactly ``tokens[:matched]``.
        """
        tokens = tuple(tokens)
        path: list[Node] = []
        node = self.root
        pos = 0
        n = len(tokens)
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            key = child.key
            k = len(key)
            if tokens[pos:pos + k] == key:
                path.append(child)
                pos += k
                node = child
                continue
            common = common_prefix_len(key, tokens[pos:pos + k])
            path.append(self.split(child, common))
            pos += common
            break
        return path, pos

    def covering(self, tokens: Sequence[int]) -> list[Node]:
        """Nodes along ``tokens`` from the root, without splitting: the last one may extend past
        the end of ``tokens``; the walk stops where the tree departs from them."""
        tokens = tuple(tokens)
        out, node, pos = [], self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None or tokens[pos:pos + len(child)] != child.key[:len(tokens) - pos]:
                break
            out.append(child)
            pos += len(child)
            node = child
        return out

    def split(self, node: Node, at: int) -> Node:
        """Split ``node`` so that a new parent holds ``key[:at]``; returns that new upper node."""
        if not 0 < at < len(node.key):
            raise ValueError(f"cannot split a node of length {len(node.key)} at {at}")
        upper = Node(next(self._ids), node.key[:at], node.parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        upper.loading = node.loading
        upper.offloading = node.offloading
        upper.prefetched = node.prefetched
        upper.tags = set(node.tags) if node.tags else None
        if node.device is not None:
            upper.device, node.device = node.device[:at], node.device[at:]
        if node.host is not None:
            upper.host, node.host = node.host[:at], node.host[at:]
        node.parent.children[node.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        self.nodes[upper.id] = upper
        if self.on_split is not None:
            self.on_split(upper, node)
        return upper

    def add_child(self, parent: Node, key: tuple[int, ...]) -> Node:
        if not key:
            raise ValueError("a radix node needs a non-empty key")
        if key[0] in parent.children:
            raise ValueError(f"node {parent.id} already has a child starting with token {key[0]}")
        node = Node(next(self._ids), key, parent)
        parent.children[key[0]] = node
        self.nodes[node.id] = node
        return node

    def remove_leaf(self, node: Node) -> None:
        if node.children or node.parent is None:
            raise ValueError(f"node {node.id} is not a removable leaf")
        del node.parent.children[node.key[0]]
        del self.nodes[node.id]
        node.parent = None

    def path_to(self, node: Node) -> list[Node]:
        """Nodes from the root's child down to ``node`` (empty for the root)."""
        out = []
        while node.parent is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes) - 1
