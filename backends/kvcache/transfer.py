"""Host <-> device transfers as tasks: the brain assigns slots and states, the engine copies.

Loads (host -> device): nodes are LOADING from the task's creation until ``complete_load`` (now
device+host) or ``fail_load`` (back to host-only, device slots freed). Write-through offloads
(device -> host): nodes are OFFLOADING until ``complete_offload`` (device+host) or
``fail_offload`` (device-only again). In-flight nodes are never evicted. Completing or failing a
task twice raises :class:`UnknownTaskError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .errors import CacheError, UnknownTaskError
from .eviction import NO_EVICTION
from .results import EvictResult, LoadTask, OffloadTask

if TYPE_CHECKING:
    from .cache import KVCache
    from .radix import Node

__all__ = ["TransferMixin"]


class TransferMixin:
    def _start_load(self: KVCache, nodes: Sequence[Node], *, prefetch: bool) -> tuple[LoadTask | None, EvictResult]:
        """Give host-only ``nodes`` (a path segment whose parent is on device) device slots,
        evicting as needed; ``None`` when not enough device space can be freed."""
        n = sum(len(node) for node in nodes)
        evicted = NO_EVICTION
        if self.device.free_count < n:
            evicted = self.evict_device(n - self.device.free_count)
        slots = self.device.alloc(n)
        if slots is None:
            return None, evicted
        task_id = next(self._task_ids)
        host_slots: list[int] = []
        pos = 0
        for node in nodes:
            host_slots.extend(node.host)
            node.device = slots[pos:pos + len(node)]
            node.loading = task_id
            node.prefetched = prefetch
            pos += len(node)
            self._refresh(node)
            self._refresh(node.parent)
        task = LoadTask(task_id, tuple(node.id for node in nodes), tuple(host_slots), tuple(slots), n, prefetch)
        self._loads[task_id] = (task, list(nodes))
        return task, evicted

    def complete_load(self: KVCache, task: LoadTask) -> None:
        """The engine finished copying ``task``: its nodes become device+host."""
        _, nodes = self._pop_task(self._loads, task.task_id, "load")
        for node in nodes:
            node.loading = None
        if task.prefetch:
            self.stats.prefetched_tokens += task.tokens

    def fail_load(self: KVCache, task: LoadTask) -> EvictResult:
        """The copy failed: the nodes go back to host-only and their device slots are freed.

        Device nodes inserted below them meanwhile were computed from KV that never arrived: they
        are dropped (the returned result counts them). Raises :class:`CacheError`, changing
        nothing, when a request still locks such a node."""
        entry = self._loads.get(task.task_id)
        if entry is None:
            raise UnknownTaskError(f"load task {task.task_id} is not in flight (completed or failed already?)")
        nodes = entry[1]
        in_task = set(nodes)
        tainted = [c for node in nodes for c in node.children.values()
                   if c not in in_task and c.device is not None]
        if any(c.lock_ref for c in tainted):
            raise CacheError(f"load task {task.task_id} failed under nodes a request still locks")
        del self._loads[task.task_id]
        freed = sum(len(n) for c in tainted for n in _device_subtree(c))
        dropped = sum(self._drop_subtree(c) for c in tainted)
        for node in nodes:
            self.device.free(node.device)
            node.device = None
            node.loading = None
            node.prefetched = False
            self._refresh(node)
            self._refresh(node.parent)
        return EvictResult(freed, (), dropped)

    def _start_offload(self: KVCache, path: Sequence[Node]) -> OffloadTask | None:
        nodes = [n for n in path if n.device is not None and n.host is None
                 and n.loading is None and n.offloading is None]
        n = sum(len(node) for node in nodes)
        if not n:
            return None
        if self.host.free_count < n:
            self.evict_host(n - self.host.free_count)
        slots = self.host.alloc(n)
        if slots is None:
            return None  # no room: these nodes stay device-only (demoted with a copy later)
        task_id = next(self._task_ids)
        pos = 0
        for node in nodes:
            node.host = slots[pos:pos + len(node)]
            node.offloading = task_id
            pos += len(node)
            self._refresh(node)
        device_slots = tuple(s for node in nodes for s in node.device)
        task = OffloadTask(task_id, tuple(node.id for node in nodes), device_slots, tuple(slots))
        self._offloads[task_id] = (task, nodes)
        return task

    def complete_offload(self: KVCache, task: OffloadTask) -> None:
        _, nodes = self._pop_task(self._offloads, task.task_id, "offload")
        for node in nodes:
            node.offloading = None

    def fail_offload(self: KVCache, task: OffloadTask) -> None:
        _, nodes = self._pop_task(self._offloads, task.task_id, "offload")
        for node in nodes:
            self.host.free(node.host)
            node.host = None
            node.offloading = None
            self._refresh(node)

    def _pop_task(self: KVCache, table: dict, task_id: int, kind: str) -> tuple:
        entry = table.pop(task_id, None)
        if entry is None:
            raise UnknownTaskError(f"{kind} task {task_id} is not in flight (completed or failed already?)")
        return entry


def _device_subtree(top: Node) -> list[Node]:
    """``top`` and its device descendants, parents before children."""
    order = [top]
    for node in order:
        order.extend(c for c in node.children.values() if c.device is not None)
    return order
