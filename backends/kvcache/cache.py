"""KVCache: the facade every backend drives (embedded engine, simulator).

The brain decides and assigns slot indices; the engine owns the tensors, performs the copies the
results ask for, and calls back. Request life cycle, in the engine's words::

    m = cache.match_prefix(tokens)           # query; is_ready(m) is False while a prefetch loads
    adm = cache.admit(tokens)                # counts hits, locks the path, plans the load of
                                             # the host part; do adm.evicted.demoted copies, then
                                             # adm.load copies, then complete_load(adm.load)
    a = cache.alloc_device(n_new)            # slots for the tokens to compute (+ demotions)
    res = cache.insert(tokens, slots, agent=(ns, name), fixed_prefix_tokens=k)
    cache.lock(res.last_node); cache.unlock(adm.match.last_node)
    ...
    cache.unlock(res.last_node); cache.free_device(unused_slots)

Invariants: each device/host slot is free, owned by exactly one node, or (device only) held by the
caller between ``alloc_device`` and ``insert``/``free_device``; a locked node is never evicted; a
loading or offloading node is never evicted; every copy the brain relies on is reported in a result.
Not thread-safe: one owner calls it (the engine loop); worker threads only copy tensors.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict
from typing import Callable, Iterable, Mapping, Sequence

from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from .allocator import SlotAllocator
from .config import CacheConfig
from .errors import CacheError, LockError
from .hints import AgentRef, HintTable
from .policy import EvictionPolicy, make_policy
from .radix import Node, RadixTree
from .eviction import NO_EVICTION, EvictionMixin
from .integrity import check_integrity
from .leafqueue import LeafQueue
from .prefetch import PrefetchPlan, plan_prefetch
from .results import Admission, Allocation, InsertResult, LoadTask, MatchResult, OffloadTask
from .segment import Segmenter
from .stats import CacheStats
from .tagging import TaggingMixin
from .transfer import TransferMixin

__all__ = ["KVCache"]


class KVCache(EvictionMixin, TransferMixin, TaggingMixin):
    def __init__(
        self,
        config: CacheConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        policy: EvictionPolicy | None = None,
        policy_options: Mapping[str, object] | None = None,
    ) -> None:
        """``clock`` drives hint TTLs only (inject a fake one in tests / simulated time);
        ``policy`` overrides ``config.policy`` (e.g. a :class:`BeladyPolicy` given the future)."""
        self.config = config
        self.tree = RadixTree()
        self.tree.on_split = self._on_split
        self.device = SlotAllocator(config.device_tokens, "device")
        self.host = SlotAllocator(config.host_tokens, "host")
        self.hints = HintTable(
            ttl_s=config.hint_ttl_s, clock=clock, cap_tokens=config.effective_namespace_cap,
            max_workflows=config.max_workflows, max_agents=config.max_tracked_agents,
        )
        self.segmenter = Segmenter(config.segment_history, config.max_tracked_agents, config.tracked_tokens)
        self.policy = policy or make_policy(config.policy, self.hints, **dict(policy_options or {}))
        self.stats = CacheStats()
        self._tick = 0  # logical time of last access: total order, independent of the clock
        self._task_ids = itertools.count(1)
        self._loads: dict[int, tuple[LoadTask, list[Node]]] = {}
        self._offloads: dict[int, tuple[OffloadTask, list[Node]]] = {}
        self._held: set[int] = set()          # device slots handed to the caller
        self._direct_locks: Counter[int] = Counter()
        self._fixed: OrderedDict[AgentRef, tuple[int, ...]] = OrderedDict()  # agent -> fixed tokens
        self._fixed_total = 0  # tokens held in _fixed (bounded by config.tracked_tokens)
        self._device_leaves: set[Node] = set()  # on device, no child on device
        self._host_leaves: set[Node] = set()    # host only, no children
        self._untag_epoch = 0                   # bumped when tags are removed (keys may drop)
        self._device_queue = LeafQueue(self._device_leaves, self.policy.key, self.policy.version,
                                       self.policy.volatile, self._key_epoch)
        self._host_queue = LeafQueue(self._host_leaves, self.policy.key, self.policy.version,
                                     self.policy.volatile, self._key_epoch)

    # ---- queries -------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """Longest cached prefix. May split a node at the match end (structure only; no stats,
        no access-time update). An empty token list matches nothing."""
        path, _ = self.tree.walk(tokens)
        device_slots: list[int] = []
        host_slots: list[int] = []
        for node in path:
            if node.device is not None and not host_slots:
                device_slots.extend(node.device)
            else:
                host_slots.extend(node.host)
        last = path[-1] if path else self.tree.root
        return MatchResult(len(device_slots), len(host_slots), tuple(path), tuple(device_slots),
                           tuple(host_slots), last)

    def is_ready(self, match: MatchResult) -> bool:
        """False while any node of the matched path is loading (a prefetch or load in flight)."""
        return all(node.loading is None for node in match.nodes)

    def usage(self) -> dict[str, int]:
        return {
            "device_used": self.device.used_count, "device_total": self.device.capacity,
            "host_used": self.host.used_count, "host_total": self.host.capacity,
            "device_held": len(self._held), "nodes": len(self.tree),
            "loads_in_flight": len(self._loads), "workflows": self.hints.workflow_count,
        }

    # ---- admission and insertion ---------------------------------------------------------
    def admit(self, tokens: Sequence[int]) -> Admission:
        """Admit a request: count its hits, lock its matched path, start loading its host part.

        When the host part cannot get device slots (everything else locked), it is not loaded:
        the returned match then stops at the device part and those tokens count as recomputed.
        """
        match = self.match_prefix(tokens)
        self.policy.on_request(tokens)
        self._touch(match.nodes)
        self.lock(match.last_node)  # before any eviction below: our own path must stay
        n_device = sum(1 for node in match.nodes if node.device is not None)
        device_nodes, host_nodes = match.nodes[:n_device], match.nodes[n_device:]
        load, evicted = None, NO_EVICTION
        if host_nodes:
            load, evicted = self._start_load(host_nodes, prefetch=False)
            if load is None:
                last = device_nodes[-1] if device_nodes else self.tree.root
                self.lock(last)
                self.unlock(match.last_node)
                match = MatchResult(match.device_tokens, 0, device_nodes, match.device_slots, (), last)
        for node in device_nodes:
            if node.prefetched:
                self.stats.prefetch_hit_tokens += len(node)
                node.prefetched = False
            else:
                self.stats.device_hit_tokens += len(node)
        self.stats.host_hit_tokens += match.host_tokens
        self.stats.recomputed_tokens += len(tokens) - match.cached_tokens
        return Admission(match, load, evicted)

    def alloc_device(self, n: int) -> Allocation:
        """Hand ``n`` device slots to the caller, evicting as needed. ``slots`` is ``None`` when
        not enough can be freed (the eviction done so far still has to be honoured)."""
        if n < 0:
            raise CacheError(f"cannot allocate {n} slots")
        evicted = NO_EVICTION
        if self.device.free_count < n:
            evicted = self.evict_device(n - self.device.free_count)
        slots = self.device.alloc(n)
        if slots is None:
            return Allocation(None, evicted)
        self._held.update(slots)
        return Allocation(tuple(slots), evicted)

    def free_device(self, slots: Iterable[int]) -> None:
        """Return caller-held slots (from ``alloc_device``) that were not inserted."""
        slots = list(slots)
        bad = [s for s in slots if s not in self._held]
        if bad or len(set(slots)) != len(slots):
            raise CacheError(f"device slots {bad or slots} are not held by the caller")
        self._held.difference_update(slots)
        self.device.free(slots)

    def insert(
        self,
        tokens: Sequence[int],
        device_slots: Sequence[int],
        *,
        agent: AgentRef | None = None,
        fixed_prefix_tokens: int | None = None,
    ) -> InsertResult:
        """Cache ``tokens`` whose KV sits in ``device_slots`` (one per token).

        Positions already cached on device keep the cache's slots; the caller's slot there is a
        duplicate and is freed (unless it is the cache's own slot). Positions cached on host only
        take the caller's slot (the node becomes device+host). New positions become a new leaf.
        Every caller slot that is not already the cache's must be held (``alloc_device``).
        Pass ``agent`` once per request (the segmentation heuristic counts requests): the agent's
        fixed prefix is then tagged. Empty ``tokens`` is a no-op.
        """
        tokens = tuple(tokens)
        slots = tuple(device_slots)
        if len(slots) != len(tokens):
            raise CacheError(f"insert got {len(tokens)} tokens but {len(slots)} device slots")
        if agent is not None:
            # Validate before mutating anything.
            if fixed_prefix_tokens is not None and fixed_prefix_tokens < 0:
                raise CacheError(f"fixed_prefix_tokens must be >= 0, got {fixed_prefix_tokens}")
        if not tokens:
            return InsertResult(0, (), (), self.tree.root, None)
        path, matched = self.tree.walk(tokens)
        self._check_caller_slots(path, slots, matched)
        duplicates: list[int] = []
        pos = 0
        for node in path:
            mine = slots[pos:pos + len(node)]
            if node.device is None:
                node.device = list(mine)
                self._held.difference_update(mine)
                self._refresh(node)
                self._refresh(node.parent)
            else:
                duplicates.extend(s for s, t in zip(mine, node.device) if s != t)
            pos += len(node)
        if duplicates:
            self._held.difference_update(duplicates)
            self.device.free(duplicates)
        last = path[-1] if path else self.tree.root
        new_tokens = len(tokens) - matched
        if new_tokens:
            last = self.tree.add_child(last, tokens[matched:])
            last.device = list(slots[matched:])
            self._held.difference_update(last.device)
            self._refresh(last)
            self._refresh(last.parent)
            path.append(last)
        self._touch(path)
        offload = self._start_offload(path) if self.config.write_through and self.config.has_host_tier else None
        if agent is not None:
            fixed = self.segmenter.observe(agent, tokens, fixed_prefix_tokens)
            self._tag_fixed_prefix(agent, tokens[:fixed])
        out_slots = tuple(s for node in path for s in node.device)
        return InsertResult(new_tokens, tuple(duplicates), out_slots, last, offload)

    def _check_caller_slots(self, path: list[Node], slots: tuple[int, ...], matched: int) -> None:
        pos = 0
        for node in path:
            for i, s in enumerate(slots[pos:pos + len(node)]):
                if not (node.device is not None and node.device[i] == s) and s not in self._held:
                    raise CacheError(f"device slot {s} (token {pos + i}) is not held by the caller")
            pos += len(node)
        if len(set(slots)) != len(slots):
            raise CacheError("insert got the same device slot twice")
        for i, s in enumerate(slots[matched:], start=matched):
            if s not in self._held:
                raise CacheError(f"device slot {s} (token {i}) is not held by the caller")

    # ---- locks -------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Protect ``node`` and its ancestors from eviction until ``unlock(node)``."""
        if node.parent is None and node is not self.tree.root:
            raise LockError(f"node {node.id} is no longer in the tree")
        self._direct_locks[node.id] += 1
        while node.parent is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        """Release one ``lock(node)``; raises :class:`LockError` (changing nothing) when ``node``
        holds no lock of its own (a double unlock)."""
        if self._direct_locks.get(node.id, 0) <= 0:
            raise LockError(f"unlock of node {node.id} that holds no lock (double unlock?)")
        self._direct_locks[node.id] -= 1
        if not self._direct_locks[node.id]:
            del self._direct_locks[node.id]
        while node.parent is not None:
            node.lock_ref -= 1
            node = node.parent

    # ---- hints -------------------------------------------------------------------------
    def apply_hint(self, hint: KVFlowHint) -> None:
        """Record a request's hint (steps of its workflow); call ``plan_prefetch`` afterwards."""
        self.hints.apply_hint(hint)

    def apply_steps(self, update: StepsUpdate) -> None:
        """Apply ``POST /kvflow/v1/steps``; ``done`` forgets the workflow."""
        self.hints.apply_steps(update)

    # ---- helpers shared with eviction / prefetch ----------------------------------------
    def _touch(self, nodes: Iterable[Node]) -> None:
        self._tick += 1
        for node in nodes:
            node.last_access = self._tick

    def _on_split(self, upper: Node, lower: Node) -> None:
        for table in (self._loads, self._offloads):
            for task_id in (lower.loading, lower.offloading):
                if task_id is not None and task_id in table:
                    table[task_id][1].append(upper)
        self._refresh(upper)
        self._refresh(lower)

    def _refresh(self, node: Node) -> None:
        """Recompute the leaf-set membership of ``node`` (call after any change to it or its
        children)."""
        if node.parent is None:
            return
        if node.device is not None and not any(c.device is not None for c in node.children.values()):
            if node not in self._device_leaves:
                self._device_leaves.add(node)
                self._device_queue.add(node)
        else:
            self._device_leaves.discard(node)
        if node.device is None and not node.children:
            if node not in self._host_leaves:
                self._host_leaves.add(node)
                self._host_queue.add(node)
        else:
            self._host_leaves.discard(node)

    def _key_epoch(self) -> int:
        return self._untag_epoch

    # ---- delegated to their own modules --------------------------------------------------
    def plan_prefetch(self) -> PrefetchPlan:
        """Load tasks for the fixed prefixes of agents due within the lookahead (see prefetch.py)."""
        return plan_prefetch(self)

    def check_integrity(self) -> bool:
        """Verify every invariant; raises :class:`IntegrityError` naming the first broken one."""
        return check_integrity(self)
