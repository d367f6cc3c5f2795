"""Eviction mechanics of :class:`~backends.kvcache.cache.KVCache` (order comes from the policy).

Device eviction takes unlocked device leaves (no child on device, not loading or offloading) in
policy order; a parent becomes a candidate once its children are gone from the device. A victim
with a host copy just frees its device slots; without one it is demoted (write-back: host slots
allocated, host evicted first by the same policy when full, copy reported as a
:class:`Demotion`) or, with no room or no host tier, dropped together with its host-only subtree.
Host eviction drops unlocked host-only leaves. Asking for more than exists frees what it can.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .errors import CacheError
from .results import Demotion, EvictResult

if TYPE_CHECKING:
    from .cache import KVCache
    from .radix import Node

__all__ = ["EvictionMixin", "NO_EVICTION"]

NO_EVICTION = EvictResult(0, (), 0)


def merge_evictions(results: list[EvictResult]) -> EvictResult:
    if not results:
        return NO_EVICTION
    return EvictResult(sum(r.freed for r in results), tuple(d for r in results for d in r.demoted),
                       sum(r.dropped for r in results))


class EvictionMixin:
    def evict_device(self: KVCache, n: int) -> EvictResult:
        """Free at least ``n`` device tokens if that many are evictable (else as many as are)."""
        if n < 0:
            raise CacheError(f"cannot evict a negative number of tokens ({n})")
        if n == 0:
            return NO_EVICTION
        self.hints.expire()
        victims, _ = self._victims(n)
        return self._evict_nodes(victims)

    def evict_host(self: KVCache, n: int) -> EvictResult:
        """Drop at least ``n`` host-only tokens if that many are evictable (else as many as are)."""
        if n < 0:
            raise CacheError(f"cannot evict a negative number of tokens ({n})")
        if n == 0 or not self._host_leaves:
            return NO_EVICTION
        self.hints.expire()
        queue = self._host_queue
        queue.begin()
        freed = 0
        while freed < n:
            node = queue.pop(_host_evictable)
            if node is None:
                break
            freed += self._drop_subtree(node)  # a parent left as a host leaf joins the queue
        queue.end()
        return EvictResult(freed, (), freed)

    def _victims(self: KVCache, n: int, stop: Callable[[Node], bool] | None = None) -> tuple[list[Node], int]:
        """The device victims for ``n`` tokens in policy order, without changing anything.

        Stops early at the first node for which ``stop(node)`` is true (the prefetch budget)."""
        queue = self._device_queue
        queue.begin()
        chosen: list[Node] = []
        gone: set[Node] = set()
        got = 0
        while got < n:
            node = queue.pop(_device_evictable)
            if node is None or (stop is not None and stop(node)):
                break
            chosen.append(node)
            gone.add(node)
            got += len(node)
            parent = node.parent
            if (parent.parent is not None and _device_evictable(parent)
                    and all(c.device is None or c in gone for c in parent.children.values())):
                queue.offer(parent)
        queue.end()  # nothing is evicted yet; entries of nodes evicted later become garbage
        return chosen, got

    def _evict_nodes(self: KVCache, victims: list[Node]) -> EvictResult:
        demoted: list[Demotion] = []
        freed = dropped = 0
        for node in victims:
            freed += len(node)
            dropped += self._demote_or_drop(node, demoted)
        return EvictResult(freed, tuple(demoted), dropped)

    def _demote_or_drop(self: KVCache, node: Node, demoted: list[Demotion]) -> int:
        """Take ``node`` off the device; returns the tokens dropped from the tree."""
        n = len(node)
        dropped = 0
        if node.host is None and self.config.has_host_tier:
            host = self.host.alloc(n)
            if host is None:
                dropped = self.evict_host(n - self.host.free_count).dropped
                host = self.host.alloc(n)
            if host is not None:
                demoted.append(Demotion(node.id, tuple(node.device), tuple(host)))
                node.host = host
        if node.host is not None:
            self._release_device(node)
            return dropped
        return dropped + self._drop_subtree(node)

    def _release_device(self: KVCache, node: Node) -> None:
        n = len(node)
        self.device.free(node.device)
        node.device = None
        self.stats.evicted_device_tokens += n
        if node.prefetched:
            self.stats.prefetch_unused_tokens += n
            node.prefetched = False
        self._refresh(node)
        self._refresh(node.parent)

    def _drop_subtree(self: KVCache, top: Node) -> int:
        """Remove ``top`` and all its descendants from the tree; returns the tokens removed."""
        order = [top]
        for node in order:
            order.extend(node.children.values())
        removed = 0
        parent = top.parent
        for node in reversed(order):  # children before parents: each is a leaf when removed
            if node.device is not None:
                self._release_device(node)
            if node.host is not None:
                self.host.free(node.host)
                self.stats.evicted_host_tokens += len(node)
                node.host = None
            self._device_leaves.discard(node)
            self._host_leaves.discard(node)
            removed += len(node)
            self.tree.remove_leaf(node)
        self._refresh(parent)
        return removed


def _unpinned(node: Node) -> bool:
    return node.lock_ref == 0 and node.loading is None and node.offloading is None


def _device_evictable(node: Node) -> bool:
    return node.device is not None and _unpinned(node)


def _host_evictable(node: Node) -> bool:
    return node.device is None and not node.children and _unpinned(node)
