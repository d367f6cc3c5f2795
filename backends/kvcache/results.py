"""Named result types of the cache brain. Data movement is explicit: the brain decides and assigns
slots, the engine performs the copies and reports back."""

from __future__ import annotations

from typing import NamedTuple

from .radix import Node

__all__ = ["MatchResult", "InsertResult", "Demotion", "EvictResult", "LoadTask", "OffloadTask",
           "Allocation", "Admission", "PrefetchPlan", "LockHandle", "NO_EVICTION", "FlushResult",
           "merge_evictions"]

LockHandle = Node
"""What ``KVCache.lock``/``unlock`` take. Hosts treat it as opaque: they hold it and pass it back,
never read it (it is the radix node at the end of a locked path)."""


class MatchResult(NamedTuple):
    """Longest cached prefix of a token list.

    ``device_tokens`` leading tokens have device slots (``device_slots``; valid once every node is
    ready, see ``KVCache.is_ready``); the next ``host_tokens`` tokens exist only on host
    (``host_slots``). ``nodes`` is the matched path (root excluded); ``last_node`` its end (the root
    when nothing matched), the handle to ``lock``/``unlock``.
    """

    device_tokens: int
    host_tokens: int
    nodes: tuple[Node, ...]
    device_slots: tuple[int, ...]
    host_slots: tuple[int, ...]
    last_node: Node

    @property
    def cached_tokens(self) -> int:
        return self.device_tokens + self.host_tokens

    @property
    def handle(self) -> LockHandle:
        """Pass to ``KVCache.lock``/``unlock`` to protect the matched path."""
        return self.last_node


class Demotion(NamedTuple):
    """Copy device rows ``device_slots[i]`` to host rows ``host_slots[i]`` BEFORE the engine writes
    anything into those device slots again (they are already back in the free list)."""

    node_id: int
    device_slots: tuple[int, ...]
    host_slots: tuple[int, ...]


class EvictResult(NamedTuple):
    """``freed``: tokens whose slots (of the tier evicted) went back to the free list;
    ``demoted``: copies the engine must perform (write-back; empty when a host copy existed);
    ``dropped``: tokens removed from the tree altogether (both tiers)."""

    freed: int
    demoted: tuple[Demotion, ...]
    dropped: int


NO_EVICTION = EvictResult(0, (), 0)


def merge_evictions(results: list[EvictResult]) -> EvictResult:
    """Several evictions as one (their demotions in order); :data:`NO_EVICTION` for none."""
    done = [r for r in results if r.freed or r.demoted or r.dropped]
    if not done:
        return NO_EVICTION
    if len(done) == 1:
        return done[0]
    return EvictResult(sum(r.freed for r in done), tuple(d for r in done for d in r.demoted),
                       sum(r.dropped for r in done))


class FlushResult(NamedTuple):
    """What :meth:`KVCache.flush` freed: ``device_tokens`` / ``host_tokens`` whose slots went back
    to the free lists, ``nodes`` removed from the tree; ``kept_tokens``: tokens of nodes it had to
    keep (locked by a request, or a load/offload in flight)."""

    device_tokens: int
    host_tokens: int
    nodes: int
    kept_tokens: int


class LoadTask(NamedTuple):
    """Copy host rows ``host_slots[i]`` into device rows ``device_slots[i]``, then call
    ``KVCache.complete_load(task)`` (or ``fail_load(task)``: the nodes go back to host-only).

    ``node_ids`` are the nodes at planning time (informative: a later split adds nodes that the
    cache tracks itself); the slots never change."""

    task_id: int
    node_ids: tuple[int, ...]
    host_slots: tuple[int, ...]
    device_slots: tuple[int, ...]
    tokens: int
    prefetch: bool


class OffloadTask(NamedTuple):
    """Write-through: copy device rows into host rows, then ``KVCache.complete_offload(task)``."""

    task_id: int
    node_ids: tuple[int, ...]
    device_slots: tuple[int, ...]
    host_slots: tuple[int, ...]


class InsertResult(NamedTuple):
    """``new_tokens``: tokens that became cached; ``duplicate_slots``: caller slots whose tokens
    were already cached (the brain freed them: stop using them, use ``device_slots`` instead);
    ``device_slots``: the cache's slots for the whole token list; ``offload``: write-through copy
    to perform (``None`` without write-through or when the host has no room)."""

    new_tokens: int
    duplicate_slots: tuple[int, ...]
    device_slots: tuple[int, ...]
    last_node: Node
    offload: OffloadTask | None


class Allocation(NamedTuple):
    """Device slots handed to the caller (not owned by the tree until ``insert``), and the
    eviction performed to find them (perform its demotions first)."""

    slots: tuple[int, ...]
    evicted: EvictResult


class Admission(NamedTuple):
    """A request admitted: its match (path locked), the load of its host-only part (``None`` when
    none; copy then ``complete_load``), and the eviction that made room for that load.

    Hosts use ``prefix_slots``, ``cached_tokens`` and ``handle``; ``match`` is the brain's view."""

    match: MatchResult
    load: LoadTask | None
    evicted: EvictResult

    @property
    def prefix_slots(self) -> tuple[int, ...]:
        """Device slots of the whole admitted prefix, in token order (valid once ``load`` is done)."""
        if self.load is None:
            return self.match.device_slots
        return self.match.device_slots + self.load.device_slots

    @property
    def cached_tokens(self) -> int:
        """Tokens of the prompt served from the cache (device part plus the loaded host part)."""
        return self.match.cached_tokens

    @property
    def handle(self) -> LockHandle:
        """The lock ``admit`` took; pass it to ``KVCache.unlock`` when the request ends."""
        return self.match.last_node


class PrefetchPlan(NamedTuple):
    """Perform ``evicted.demoted`` copies first, then each task's copy, then ``complete_load``."""

    tasks: tuple[LoadTask, ...]
    evicted: EvictResult
