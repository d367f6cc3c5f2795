"""Lazy priority queue over a tier's eviction candidates (device leaves or host leaves).

Rebuilding a heap over every leaf at each eviction (what SGLang does) costs O(leaves) per call;
this queue keeps its heap between calls and repairs it lazily:

* keys may only *grow* between two changes of ``version_of()`` (LRU/kvflow keys grow when a node
  is touched or tagged); a popped entry whose key grew is pushed back with its new key;
* anything that can lower keys changes a version: ``version_of()`` (a hint update, Belady's
  clock) makes the next pass push fresh entries for the members that ``volatile`` names (for
  kvflow: tagged nodes; older entries repair themselves when popped); ``epoch_of()`` (a tag
  removed) makes it rebuild the heap from ``members``;
* entries of nodes that left ``members`` are dropped when popped; a pass pushes back every entry
  it popped (e.g. locked nodes), so nothing is lost.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .radix import Node

__all__ = ["LeafQueue"]


class LeafQueue:
    def __init__(
        self,
        members: set[Node],
        key_of: Callable[[Node], Any],
        version_of: Callable[[], Any],
        volatile: Callable[[Node], bool],
        epoch_of: Callable[[], Any],
    ) -> None:
        self.members = members
        self.key_of = key_of
        self.version_of = version_of
        self.volatile = volatile
        self.epoch_of = epoch_of
        self._heap: list[tuple[Any, int, Node]] = []
        self._version: object = object()  # never equal: the first pass builds the heap
        self._epoch: object = object()
        self._taken: list[tuple[Any, int, Node]] = []
        self._extra: set[Node] = set()
        self._seen: set[Node] = set()

    def add(self, node: Node) -> None:
        """``node`` joined ``members`` (or may have a smaller key than its entry)."""
        if self._epoch == self.epoch_of():  # else the next pass rebuilds from members anyway
            heapq.heappush(self._heap, (self.key_of(node), node.id, node))

    def begin(self) -> None:
        """Start a pass: rebuild if the keys may have dropped or the heap is mostly garbage."""
        version, epoch = self.version_of(), self.epoch_of()
        if epoch != self._epoch or len(self._heap) > 2 * len(self.members) + 64:
            self._heap = [(self.key_of(n), n.id, n) for n in self.members]
            heapq.heapify(self._heap)
        elif version != self._version:
            key_of, volatile = self.key_of, self.volatile
            fresh = [(key_of(n), n.id, n) for n in self.members if volatile(n)]
            if len(fresh) > len(self._heap) // 4:
                self._heap.extend(fresh)
                heapq.heapify(self._heap)
            else:
                for entry in fresh:
                    heapq.heappush(self._heap, entry)
        self._version, self._epoch = version, epoch
        self._taken, self._extra, self._seen = [], set(), set()

    def offer(self, node: Node) -> None:
        """During a pass: ``node`` is a candidate from now on (its children were just taken)."""
        self._extra.add(node)
        heapq.heappush(self._heap, (self.key_of(node), node.id, node))

    def pop(self, usable: Callable[[Node], bool]) -> Node | None:
        """Next candidate in key order for which ``usable`` holds; ``None`` when exhausted."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            key, _, node = entry
            if node in self._seen or (node not in self.members and node not in self._extra):
                continue  # duplicate or garbage
            current = self.key_of(node)
            if current != key:
                heapq.heappush(heap, (current, node.id, node))
                continue
            self._seen.add(node)
            self._taken.append(entry)
            if usable(node):
                return node
        return None

    def end(self) -> None:
        """Finish a pass: every entry it popped goes back into the heap (those of nodes the caller
        removed meanwhile are garbage, dropped when popped again)."""
        for entry in self._taken:
            heapq.heappush(self._heap, entry)
        self._taken, self._extra, self._seen = [], set(), set()
