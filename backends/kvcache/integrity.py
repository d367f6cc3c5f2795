"""``KVCache.check_integrity``: every invariant of the brain's tree, pools and tasks, checked.

The invariants are those of :mod:`.cache`'s docstring and :mod:`.radix`'s: each slot free, owned by
exactly one node, or held by the caller; lock counts that add up along every path; the device tier a
rooted subtree; in-flight nodes with both tiers' slots; leaf sets and task books that match the
tree. Tests call it after every operation; the server's debug route exposes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .allocator import SlotAllocator
from .errors import IntegrityError
from .radix import Node

if TYPE_CHECKING:
    from .cache import KVCache

__all__ = ["check_integrity"]


def check_integrity(cache: KVCache) -> bool:
    """Verify every invariant of ``cache``; raises :class:`IntegrityError` naming the first broken one."""
    tree = cache.tree
    device_owner: dict[int, int] = {}
    host_owner: dict[int, int] = {}
    seen: set[int] = set()
    stack: list[Node] = [tree.root]
    while stack:
        node = stack.pop()
        if node.id in seen:
            _fail(f"node {node.id} reached twice (cycle)")
        seen.add(node.id)
        if tree.nodes.get(node.id) is not node:
            _fail(f"node {node.id} is in the tree but not in the id index")
        _check_node(cache, node, device_owner, host_owner)
        stack.extend(node.children.values())
    if len(seen) != len(tree.nodes):
        _fail(f"id index holds {len(tree.nodes)} nodes, the tree {len(seen)}")
    _check_pool("device", cache.device, device_owner, cache._held)
    _check_pool("host", cache.host, host_owner, set())
    _check_tasks(cache)
    if any(v < 0 for v in cache.stats.as_dict().values()):
        _fail(f"negative counter in {cache.stats}")
    return True


def _check_node(cache: KVCache, node: Node, device_owner: dict[int, int], host_owner: dict[int, int]) -> None:
    for first, child in node.children.items():
        if child.parent is not node or not child.key or child.key[0] != first:
            _fail(f"child {child.id} of node {node.id} is misfiled (parent or first token)")
    direct = cache._direct_locks.get(node.id, 0)
    expected = direct + sum(c.lock_ref for c in node.children.values())
    if node.parent is not None and node.lock_ref != expected:
        _fail(f"node {node.id} has lock_ref {node.lock_ref}, expected {expected}")
    if node.parent is None:
        return
    n = len(node.key)
    if node.device is None and node.host is None:
        _fail(f"node {node.id} has neither device nor host slots")
    for tier, slots, owner in (("device", node.device, device_owner), ("host", node.host, host_owner)):
        if slots is None:
            continue
        if len(slots) != n:
            _fail(f"node {node.id} has {len(slots)} {tier} slots for {n} tokens")
        for s in slots:
            if s in owner:
                _fail(f"{tier} slot {s} owned by nodes {owner[s]} and {node.id}")
            owner[s] = node.id
    if node.device is not None and node.parent.parent is not None and node.parent.device is None:
        _fail(f"node {node.id} is on device but its parent {node.parent.id} is not")
    if (node.loading is not None or node.offloading is not None) and (node.device is None or node.host is None):
        _fail(f"node {node.id} is in flight without both device and host slots")
    is_dev_leaf = node.device is not None and not any(c.device is not None for c in node.children.values())
    if is_dev_leaf != (node in cache._device_leaves):
        _fail(f"device-leaf set is stale for node {node.id}")
    is_host_leaf = node.device is None and not node.children
    if is_host_leaf != (node in cache._host_leaves):
        _fail(f"host-leaf set is stale for node {node.id}")

def _check_tasks(cache: KVCache) -> None:
    books = (("loading", cache._loads), ("offloading", cache._offloads))
    for attr, book in books:
        for task_id, nodes in book.entries():
            for node in nodes:
                if getattr(node, attr) != task_id or cache.tree.nodes.get(node.id) is not node:
                    _fail(f"node {node.id} of task {task_id} is not {attr} for it")
    for node in cache.tree:
        for attr, book in books:
            if getattr(node, attr) is not None and getattr(node, attr) not in book:
                _fail(f"node {node.id} is {attr} for an unknown task")


def _fail(msg: str) -> None:
    raise IntegrityError(msg)


def _check_pool(tier: str, pool: SlotAllocator, owned: dict[int, int], held: set[int]) -> None:
    free = pool.free_slots()
    if len(set(free)) != len(free):
        _fail(f"{tier} free list holds a slot twice")
    free_set = set(free)
    for s in owned:
        if s in free_set:
            _fail(f"{tier} slot {s} is owned by node {owned[s]} and free")
        if s in held:
            _fail(f"{tier} slot {s} is owned by node {owned[s]} and held by the caller")
    if held & free_set:
        _fail(f"{tier} slots {sorted(held & free_set)[:5]} are held and free")
    if len(owned) + len(held) + len(free) != pool.capacity:
        _fail(f"{tier} pool leaks slots: {len(owned)} owned + {len(held)} held + {len(free)} free != {pool.capacity}")
