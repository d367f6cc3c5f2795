"""KVCache: the cache brain every backend drives (embedded engine, simulator).

The brain decides and assigns slot indices; the engine owns the tensors, performs the copies the
results ask for, and calls back. A request's life, in the engine's words (the simulator's too)::

    d = cache.accept(AgentRequest(prompt, hint, k))  # arrival: hint applied, fixed boundary decided
    r = cache.reserve(prompt, max_new_tokens)     # admission (.lifecycle): Refused, or room made,
                                                  # hits counted, path locked, slots allocated; do
                                                  # r.evicted.demoted copies, then r.load copies,
                                                  # then complete_load(r.load)
    ...                                           # compute into r.slots(...)
    res = cache.release(r, computed_tokens, d)    # insert (tagged per d), free the rest, unlock

``reserve``/``release`` are made of the narrower verbs, which stay public: ``match_prefix``,
``admit`` (counts hits, locks, plans the host part's load), ``alloc_device``, ``insert``,
``free_device``, ``lock``/``unlock``.

Invariants: each device/host slot is free, owned by exactly one node, or (device only) held by the
caller between ``alloc_device`` and ``insert``/``free_device``; a locked node is never evicted; a
loading or offloading node is never evicted; every copy the brain relies on is reported in a result.
Not thread-safe: one owner calls it (the engine loop); worker threads only copy tensors.

Eviction *order* is the policy's (:mod:`.policy`, kept by :class:`~.leafqueue.LeafQueue`); this
class holds the mechanics:

* **Eviction.** Device eviction takes unlocked device leaves (no child on device, not loading or
  offloading) in policy order; a parent becomes a candidate once its children are gone from the
  device. A victim with a host copy just frees its device slots; without one it is demoted
  (write-back: host slots allocated, host evicted first by the same policy when full, copy reported
  as a :class:`Demotion`) or, with no room or no host tier, dropped with its host-only subtree.
  Host eviction drops unlocked host-only leaves. Asking for more than exists frees what it can.
* **Transfers.** Loads (host -> device): nodes are LOADING from the task's creation until
  ``complete_load`` (now device+host) or ``fail_load`` (back to host-only). Write-through offloads
  (device -> host): OFFLOADING until ``complete_offload`` or ``fail_offload`` (device-only again).
  Completing or failing a task twice raises :class:`UnknownTaskError`.
* **Agent tags.** An agent's fixed prefix (the intake's boundary, :mod:`.intake`) is tagged on
  every node from the root to its end, splitting the node at the boundary so the dynamic suffix
  stays untagged; a moved boundary untags the old path. The agent registry (:mod:`.prefixes`) is
  bounded in agents and tokens; an agent forgotten there loses its tags.
* **Prefetch.** After a hint update, every agent whose effective steps are <= the lookahead (every
  branch candidate counts, most urgent first) and whose fixed prefix is (partly) host-only gets a
  :class:`LoadTask`, within a budget (:mod:`.budget`, SGLang's too): free device slots, plus device
  space whose eviction removes nothing as urgent as that agent (only untagged nodes and nodes with
  larger steps, in policy order), and at most ``max_inflight_loads`` prefetch tasks in flight. A
  loading prefix is skipped.
  Steps may be fractional (expected steps under learned routing, which grow as an agent becomes
  unlikely): the same rule then loads the likeliest candidates first and only into room held by
  less likely agents, so a load never displaces a likelier agent and is itself evicted before any
  likelier one; the lookahead bounds how unlikely a candidate may be and still be loaded.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from contextlib import closing
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from .allocator import SlotAllocator
from .budget import prefetch_room, take_in_order
from .config import CacheConfig
from .continuations import Continuation
from .errors import CacheError, LockError
from .hints import AgentRef
from .intake import UNHINTED, AgentRequest, IntakeDecision, RequestIntake
from .integrity import check_integrity
from .leafqueue import LeafQueue
from .lifecycle import Refused, Reservation, release, reserve
from .policy import EvictionPolicy, make_policy
from .radix import Node, RadixTree
from .results import (
    NO_EVICTION, Admission, Allocation, Demotion, EvictResult, FlushResult, InsertResult, LoadTask,
    LockHandle, MatchResult, OffloadTask, PrefetchPlan, merge_evictions,
)
from .stats import CacheStats
from .tasks import TaskBook

__all__ = ["KVCache"]

EMPTY_PLAN = PrefetchPlan((), NO_EVICTION)


class KVCache:
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
        self.intake: RequestIntake[tuple[int, ...]] = RequestIntake(config, clock=clock)  # records: fixed tokens
        self.hints = self.intake.hints
        self.segmenter = self.intake.segmenter
        self.policy = policy or make_policy(config.policy, self.hints, **dict(policy_options or {}))
        self.stats = CacheStats()
        self._tick = 0  # logical time of last access: total order, independent of the clock
        self._task_ids = itertools.count(1)
        self._loads: TaskBook[LoadTask] = TaskBook("load")
        self._offloads: TaskBook[OffloadTask] = TaskBook("offload")
        self._held: set[int] = set()          # device slots handed to the caller
        self._direct_locks: Counter[int] = Counter()
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

    def fixed_prefix(self, agent: AgentRef) -> tuple[int, ...] | None:
        """The agent's current fixed-prefix tokens (``None`` when unknown)."""
        return self.intake.prefixes.get(agent)

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
        self._count_hits(device_nodes, match, len(tokens))
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

    def still_held(self, slots: Iterable[int]) -> list[int]:
        """Those of ``slots`` the caller still holds (handed out and not inserted or freed)."""
        return [s for s in slots if s in self._held]

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
        With ``agent``, the first ``fixed_prefix_tokens`` tokens are tagged as its fixed prefix
        (what :meth:`accept` decided); without a boundary the intake infers one from ``tokens``
        (pass ``agent`` once per request then: the inference compares requests). Empty ``tokens``
        is a no-op.
        """
        tokens = tuple(tokens)
        slots = tuple(device_slots)
        if len(slots) != len(tokens):
            raise CacheError(f"insert got {len(tokens)} tokens but {len(slots)} device slots")
        if agent is not None and fixed_prefix_tokens is not None and fixed_prefix_tokens < 0:
            raise CacheError(f"fixed_prefix_tokens must be >= 0, got {fixed_prefix_tokens}")
        if not tokens:
            return InsertResult(0, (), (), self.tree.root, None)
        path, matched = self.tree.walk(tokens)
        self._check_caller_slots(path, slots, matched)
        duplicates = self._adopt_slots(path, slots)
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
            fixed = fixed_prefix_tokens
            if fixed is None:
                fixed = self.intake.fixed_boundary(agent, tokens, None)
            self._tag_fixed_prefix(agent, tokens[:fixed])
        out_slots = tuple(s for node in path for s in node.device)
        return InsertResult(new_tokens, tuple(duplicates), out_slots, last, offload)

    # ---- request life cycle (the engine's and the simulator's: rules in .lifecycle) -------
    def reserve(self, prompt: Sequence[int], max_new_tokens: int, *,
                match: MatchResult | None = None) -> Reservation | Refused:
        """Admit a request with every slot it can need, or refuse it (``loading``/full) changing
        nothing but the eviction done to make room."""
        return reserve(self, prompt, max_new_tokens, match=match)

    def release(self, reservation: Reservation, tokens: Sequence[int] | None,
                intake: IntakeDecision = UNHINTED) -> InsertResult | None:
        """End a reserved request: insert its computed ``tokens`` (``None``: nothing) tagged per
        ``intake``, free its other slots, unlock. A request of a session then concludes its turn
        (:meth:`RequestIntake.conclude <.intake.RequestIntake.conclude>`): the conversation it
        returned to is dropped, and a hint's ``resume_in_s`` keeps the new one."""
        result = release(self, reservation, tokens, intake)
        if tokens is not None and intake.session is not None:
            kept, stale = self.intake.conclude(intake, tuple(tokens), len(tokens))
            self._retag(stale, kept)
        return result

    def returns_resident(self, prompt: Sequence[int], decision: IntakeDecision) -> bool:
        """Whether a request (``decision``: its intake's) returns to a kept conversation whose KV,
        most of its prompt, is still on device: hosts admit it first (:func:`.lifecycle.admission_order`)."""
        return decision.resumes and 2 * self.match_prefix(prompt).device_tokens >= len(prompt)

    def pause(self, session: tuple[str, str], tools: Sequence[str], resume_in_s: float | None = None) -> bool:
        """The session's last reply ended in calls of ``tools``: keep its conversation until its
        deadline (:mod:`.continuations`). Returns whether there was one to keep."""
        kept, stale = self.intake.pause(session, tools, resume_in_s)
        self._retag(stale, kept)
        return kept is not None

    # ---- locks -------------------------------------------------------------------------
    def lock(self, handle: LockHandle) -> None:
        """Protect the path ending at ``handle`` (a match's, admission's or insert's) from
        eviction until ``unlock(handle)``."""
        node = handle
        if node.parent is None and node is not self.tree.root:
            raise LockError(f"node {node.id} is no longer in the tree")
        self._direct_locks[node.id] += 1
        while node.parent is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: LockHandle) -> None:
        """Release one ``lock(handle)``; raises :class:`LockError` (changing nothing) when it
        holds no lock of its own (a double unlock)."""
        node = handle
        if self._direct_locks.get(node.id, 0) <= 0:
            raise LockError(f"unlock of node {node.id} that holds no lock (double unlock?)")
        self._direct_locks[node.id] -= 1
        if not self._direct_locks[node.id]:
            del self._direct_locks[node.id]
        while node.parent is not None:
            node.lock_ref -= 1
            node = node.parent

    # ---- hints -------------------------------------------------------------------------
    def accept(self, request: AgentRequest) -> IntakeDecision:
        """An arriving request: apply its hint, decide its fixed boundary (:mod:`.intake`); tag
        it with ``insert(..., agent=d.agent, fixed_prefix_tokens=d.fixed_tokens)`` (or
        :meth:`release`). Call ``plan_prefetch`` afterwards."""
        self.expire()
        return self.intake.accept(request)

    def expire(self) -> None:
        """Apply hint TTLs and continuation deadlines (an expired conversation loses its tags)."""
        self.hints.expire()
        self._retag(self.intake.expire_continuations(), None)

    def apply_hint(self, hint: KVFlowHint) -> None:
        """Record a hint without a request (steps of its workflow); call ``plan_prefetch`` afterwards."""
        self.intake.apply_hint(hint)

    def apply_steps(self, update: StepsUpdate) -> None:
        """Apply ``POST /kvflow/v1/steps``; ``done`` forgets the workflow."""
        self.intake.apply_steps(update)

    # ---- eviction ----------------------------------------------------------------------
    def evict_device(self, n: int) -> EvictResult:
        """Free at least ``n`` device tokens if that many are evictable (else as many as are)."""
        if n < 0:
            raise CacheError(f"cannot evict a negative number of tokens ({n})")
        if n == 0:
            return NO_EVICTION
        self.expire()
        return self._evict_nodes(self._victims(n))

    def evict_host(self, n: int) -> EvictResult:
        """Drop at least ``n`` host-only tokens if that many are evictable (else as many as are)."""
        if n < 0:
            raise CacheError(f"cannot evict a negative number of tokens ({n})")
        if n == 0 or not self._host_leaves:
            return NO_EVICTION
        self.expire()
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

    # ---- transfers ---------------------------------------------------------------------
    def complete_load(self, task: LoadTask) -> None:
        """The engine finished copying ``task``: its nodes become device+host."""
        for node in self._loads.close(task.task_id):
            node.loading = None
        if task.prefetch:
            self.stats.prefetched_tokens += task.tokens

    def fail_load(self, task: LoadTask) -> EvictResult:
        """The copy failed: the nodes go back to host-only and their device slots are freed.

        Device nodes inserted below them meanwhile were computed from KV that never arrived: they
        are dropped (the returned result counts them). Raises :class:`CacheError`, changing
        nothing, when a request still locks such a node."""
        nodes = self._loads.nodes(task.task_id)
        in_task = set(nodes)
        tainted = [c for node in nodes for c in node.children.values()
                   if c not in in_task and c.device is not None]
        if any(c.lock_ref for c in tainted):
            raise CacheError(f"load task {task.task_id} failed under nodes a request still locks")
        self._loads.close(task.task_id)
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

    def complete_offload(self, task: OffloadTask) -> None:
        """The engine finished a write-through copy: its nodes are device+host."""
        for node in self._offloads.close(task.task_id):
            node.offloading = None

    def fail_offload(self, task: OffloadTask) -> None:
        """The write-through copy failed: its nodes are device-only again."""
        for node in self._offloads.close(task.task_id):
            self.host.free(node.host)
            node.host = None
            node.offloading = None
            self._refresh(node)

    # ---- prefetch planning -------------------------------------------------------------
    def plan_prefetch(self) -> PrefetchPlan:
        """Load tasks for the fixed prefixes of agents due within the lookahead (rules in the
        module docstring). The planned nodes are LOADING until ``complete_load``."""
        cfg = self.config
        if not cfg.prefetch or not cfg.has_host_tier or cfg.max_inflight_loads == 0:
            return EMPTY_PLAN
        self.expire()
        in_flight = sum(1 for task in self._loads.tasks() if task.prefetch)
        if in_flight >= cfg.max_inflight_loads:
            return EMPTY_PLAN
        tasks: list[LoadTask] = []
        evictions: list[EvictResult] = []
        for steps, _, fixed in self.intake.due(cfg.prefetch_lookahead):
            if in_flight >= cfg.max_inflight_loads:
                break
            task = self._plan_agent_load(fixed, steps, evictions)
            if task is not None:
                tasks.append(task)
                in_flight += 1
        return PrefetchPlan(tuple(tasks), merge_evictions(evictions))

    # ---- integrity ---------------------------------------------------------------------
    def check_integrity(self) -> bool:
        """Verify every invariant; raises :class:`IntegrityError` naming the first broken one.
        Tests call it after each operation; the server's debug route exposes it."""
        return check_integrity(self)

    def flush(self) -> FlushResult:
        """Drop every node no request locks and no load/offload is moving (both tiers), as
        SGLang's ``flush_cache`` does; a locked or in-flight node and its ancestors stay. The hint
        table and the agents' fixed-prefix records stay: they describe live workflows, not cached
        KV (they drain by ``done``/TTL, and the next insert of a fixed prompt tags it again)."""
        device_before, host_before, nodes_before = self.device.used_count, self.host.used_count, len(self.tree)
        kept = 0
        stack = [self.tree.root]
        while stack:
            node = stack.pop()
            for child in list(node.children.values()):
                if child.lock_ref == 0 and not any(n.loading is not None or n.offloading is not None
                                                   for n in _subtree(child)):
                    self._drop_subtree(child)
                else:
                    kept += len(child)
                    stack.append(child)
        return FlushResult(device_before - self.device.used_count, host_before - self.host.used_count,
                           nodes_before - len(self.tree), kept)

    # ---- internal helpers: bookkeeping -------------------------------------------------
    def _touch(self, nodes: Iterable[Node]) -> None:
        self._tick += 1
        for node in nodes:
            node.last_access = self._tick

    def _count_hits(self, device_nodes: Sequence[Node], match: MatchResult, n_tokens: int) -> None:
        for node in device_nodes:
            if node.prefetched:
                self.stats.prefetch_hit_tokens += len(node)
                node.prefetched = False
            else:
                self.stats.device_hit_tokens += len(node)
        self.stats.host_hit_tokens += match.host_tokens
        self.stats.recomputed_tokens += n_tokens - match.cached_tokens

    def _on_split(self, upper: Node, lower: Node) -> None:
        self._loads.note_split(upper, lower, lower.loading)
        self._offloads.note_split(upper, lower, lower.offloading)
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

    # ---- internal helpers: insertion ---------------------------------------------------
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

    def _adopt_slots(self, path: list[Node], slots: tuple[int, ...]) -> list[int]:
        """Host-only nodes of ``path`` take the caller's slots; returns (and frees) the caller's
        slots that duplicate device KV already cached."""
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
                duplicates.extend(s for s, t in zip(mine, node.device, strict=True) if s != t)
            pos += len(node)
        if duplicates:
            self._held.difference_update(duplicates)
            self.device.free(duplicates)
        return duplicates

    # ---- internal helpers: eviction ----------------------------------------------------
    def _victims(self, n: int) -> list[Node]:
        """The device victims for ``n`` tokens in policy order, without changing anything."""
        with closing(self._eviction_order()) as order:
            return take_in_order(order, n, len)[0]

    def _eviction_order(self) -> Iterator[Node]:
        """Device-evictable nodes in policy order, a parent offered once every device child of it
        was taken. Nothing changes until the caller evicts what it took; close the iterator (the
        queue's pass ends) before evicting."""
        queue = self._device_queue
        queue.begin()
        gone: set[Node] = set()
        try:
            while (node := queue.pop(_device_evictable)) is not None:
                yield node
                gone.add(node)
                parent = node.parent
                if (parent.parent is not None and _device_evictable(parent)
                        and all(c.device is None or c in gone for c in parent.children.values())):
                    queue.offer(parent)
        finally:
            queue.end()  # nothing is evicted yet; entries of nodes evicted later become garbage

    def _evict_nodes(self, victims: list[Node]) -> EvictResult:
        demoted: list[Demotion] = []
        freed = dropped = 0
        for node in victims:
            freed += len(node)
            dropped += self._demote_or_drop(node, demoted)
        return EvictResult(freed, tuple(demoted), dropped)

    def _demote_or_drop(self, node: Node, demoted: list[Demotion]) -> int:
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

    def _release_device(self, node: Node) -> None:
        n = len(node)
        self.device.free(node.device)
        node.device = None
        self.stats.evicted_device_tokens += n
        if node.prefetched:
            self.stats.prefetch_unused_tokens += n
            node.prefetched = False
        self._refresh(node)
        self._refresh(node.parent)

    def _drop_subtree(self, top: Node) -> int:
        """Remove ``top`` and all its descendants from the tree; returns the tokens removed."""
        order = _subtree(top)
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

    # ---- internal helpers: transfers ---------------------------------------------------
    def _start_load(self, nodes: Sequence[Node], *, prefetch: bool) -> tuple[LoadTask | None, EvictResult]:
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
        self._loads.open(task_id, task, list(nodes))
        return task, evicted

    def _start_offload(self, path: Sequence[Node]) -> OffloadTask | None:
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
        self._offloads.open(task_id, task, nodes)
        return task

    # ---- internal helpers: prefetch planning -------------------------------------------
    def _plan_agent_load(self, fixed: tuple[int, ...], steps: float, evictions: list[EvictResult]) -> LoadTask | None:
        """Start loading the host-only part of an agent's ``fixed`` prefix if the budget allows
        (evictions done to make room are appended to ``evictions``)."""
        match = self.match_prefix(fixed)
        if not match.host_tokens or not self.is_ready(match):
            return None
        need = match.host_tokens - self.device.free_count
        if need > 0:
            with closing(self._eviction_order()) as order:
                victims, got = prefetch_room(order, need, steps, size=len, tags=_tags, steps_of=self.hints.steps)
            if got < need:
                return None  # would have to evict something at least as urgent: skip this agent
            evictions.append(self._evict_nodes(victims))
        host_nodes = [node for node in match.nodes if node.device is None]
        task, evicted = self._start_load(host_nodes, prefetch=True)
        evictions.append(evicted)
        return task

    # ---- internal helpers: agent tags --------------------------------------------------
    def _tag_fixed_prefix(self, ref: AgentRef, fixed: tuple[int, ...]) -> None:
        # Untag what no longer holds (the agent's old boundary, agents the registry forgot) before
        # tagging: the registry keeps its newest record, so no tag is left without a record.
        self._untag(self.intake.remember(ref, fixed, len(fixed)))
        self._tag(ref, fixed)

    def _retag(self, stale: list[tuple[AgentRef, tuple[int, ...]]], kept: Continuation | None) -> None:
        """Untag ``stale`` records, then tag a kept conversation with its continuation's ref."""
        self._untag(stale)
        if kept is not None:
            self._tag(kept.ref, kept.record)

    def _untag(self, stale: list[tuple[AgentRef, tuple[int, ...]]]) -> None:
        for stale_ref, tokens in stale:
            self._untag_epoch += 1
            for node in self.tree.covering(tokens):
                if node.tags:
                    node.tags.discard(stale_ref)

    def _tag(self, ref: AgentRef, tokens: tuple[int, ...]) -> None:
        if tokens:
            path, _ = self.tree.walk(tokens)  # splits the node at the boundary
            for node in path:
                if node.tags is None:
                    node.tags = set()
                node.tags.add(ref)


# ---- module helpers (no cache state) -------------------------------------------------------
def _subtree(top: Node) -> list[Node]:
    """``top`` and all its descendants, parents before children."""
    order = [top]
    for node in order:
        order.extend(node.children.values())
    return order


def _device_subtree(top: Node) -> list[Node]:
    """``top`` and its device descendants, parents before children."""
    order = [top]
    for node in order:
        order.extend(c for c in node.children.values() if c.device is not None)
    return order


def _tags(node: Node) -> set[AgentRef] | None:
    return node.tags


def _unpinned(node: Node) -> bool:
    return node.lock_ref == 0 and node.loading is None and node.offloading is None


def _device_evictable(node: Node) -> bool:
    return node.device is not None and _unpinned(node)


def _host_evictable(node: Node) -> bool:
    return node.device is None and not node.children and _unpinned(node)
