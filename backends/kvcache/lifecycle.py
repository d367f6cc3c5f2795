"""One request's life cycle around the brain, the same for every host that runs requests itself
(the embedded engine and the simulator), in the spirit of mini-sglang's ``CacheManager``::

    r = cache.reserve(prompt, max_new_tokens)    # Refused: wait (r.evicted still to honour)
    # copy r.evicted.demoted, then r.load (complete_load); compute positions r.reused.. into
    # r.slots(...), position i in r.slots(i + 1)[i]
    res = cache.release(r, computed_tokens, intake)   # insert + free + unlock; None: nothing kept
    # res.offload: the write-through copy to perform

Rules, in this order:

1. **Ready first.** A prompt whose cached prefix is still loading (a prefetch in flight) is refused
   as ``loading``: the host runs other requests meanwhile (status-aware) or waits (FCFS).
2. **Room first.** The matched path is locked, then device room is made for everything the request
   can need: its host-only part (to load) and every token it computes. When the pool cannot give
   that room (everything else locked), the reservation is refused as ``full`` and nothing else
   happens: no hit is counted and no load starts for a request that cannot run, so a request that
   waits is counted once, when it runs. The eviction done meanwhile stands (its demotions must be
   copied).
3. **Admit, then allocate** into the room made: hits counted, the path locked for the request, its
   host part loaded; slots for ``len(prompt) - reused + max_new_tokens - 1`` tokens, where
   ``reused`` is at most ``len(prompt) - 1`` (the last prompt token is always computed: its logits
   give the first output token) and the last output token's KV is never computed.
4. **Release** when the request ends: the tokens whose KV was computed (prompt, then outputs but
   the last) are inserted with the request's agent tag (:class:`~.intake.IntakeDecision`), the
   request's other slots are freed and its lock released. A failed or cancelled request inserts
   nothing (``tokens=None``); its slots all come back all the same.

Admission order (:func:`admission_order`): first come, first served, except that a request that
returns to a kept conversation (:mod:`.continuations`) whose KV is still on device goes ahead of new
sessions: admitted now, it locks that KV before a newcomer's room-making could evict it (program-
level order, as Continuum schedules a job's next turn). The wait of the others stays bounded: a
request passed over ``max_passed`` times goes back to plain arrival order until it is admitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, TypeVar

from .errors import CacheError
from .intake import UNHINTED, IntakeDecision
from .results import (
    NO_EVICTION, Admission, EvictResult, InsertResult, LoadTask, LockHandle, MatchResult, merge_evictions,
)

if TYPE_CHECKING:
    from .cache import KVCache

__all__ = ["Reservation", "Refused", "reserve", "release", "admission_order", "passed_over", "MAX_PASSED"]

T = TypeVar("T")
MAX_PASSED = 8
"""How many times a waiting request may be passed over by returning continuations."""


class Reservation(NamedTuple):
    """A request admitted with all its slots: copy ``evicted.demoted`` first, then ``load``."""

    admission: Admission
    reused: int
    """Cached prompt tokens the request reuses (their KV is in ``prefix_slots``)."""
    own_slots: tuple[int, ...]
    """Slots for the tokens it computes, in position order after the reused ones."""
    evicted: EvictResult

    @property
    def load(self) -> LoadTask | None:
        """The load of the prompt's host-only part (``None``: none); copy, then ``complete_load``."""
        return self.admission.load

    @property
    def handle(self) -> LockHandle:
        return self.admission.handle

    @property
    def prefix_slots(self) -> tuple[int, ...]:
        return self.admission.prefix_slots[: self.reused]

    def slots(self, end: int) -> tuple[int, ...]:
        """Slots of positions ``[0, end)``."""
        return self.prefix_slots[:end] + self.own_slots[: max(0, end - self.reused)]


class Refused(NamedTuple):
    """Not admitted: ``loading`` (its prefix is still being loaded) or not (the pool is full of
    locked KV). Honour ``evicted``'s demotions all the same."""

    loading: bool
    evicted: EvictResult


def reserve(cache: KVCache, prompt: Sequence[int], max_new_tokens: int, *,
            match: MatchResult | None = None) -> Reservation | Refused:
    """Rules 1-3 of the module docstring; ``match`` is the prompt's ``match_prefix`` if the host
    has just taken it (saves a second walk)."""
    if not prompt or max_new_tokens < 1:
        raise CacheError(f"cannot reserve for {len(prompt)} prompt tokens and {max_new_tokens} new tokens")
    if match is None:
        match = cache.match_prefix(prompt)
    if not cache.is_ready(match):
        return Refused(True, NO_EVICTION)
    need = match.host_tokens + computed_tokens(prompt, match.cached_tokens, max_new_tokens)
    cache.lock(match.handle)  # our own prefix must survive making room
    try:
        evicted = NO_EVICTION
        if cache.device.free_count < need:
            evicted = cache.evict_device(need - cache.device.free_count)
        if cache.device.free_count < need:
            return Refused(False, evicted)
        admission = cache.admit(prompt)
    finally:
        cache.unlock(match.handle)
    reused = min(len(admission.prefix_slots), len(prompt) - 1)
    allocation = cache.alloc_device(computed_tokens(prompt, reused, max_new_tokens))
    if allocation.slots is None:  # the room was made above: a broken invariant, not a full pool
        raise CacheError("the device pool lost the room made for a request while reserving it")
    return Reservation(admission, reused, allocation.slots,
                       merge_evictions([evicted, admission.evicted, allocation.evicted]))


def release(cache: KVCache, reservation: Reservation, tokens: Sequence[int] | None,
            intake: IntakeDecision = UNHINTED) -> InsertResult | None:
    """Rule 4: insert ``tokens`` (the request's computed prefix of prompt + outputs: at least
    ``reused`` and at most ``reused + len(own_slots)`` of them), free the rest, unlock. With
    ``tokens=None`` nothing is inserted. Slots and lock come back even when the insert raises."""
    result = None
    try:
        if tokens is not None:
            n = len(tokens)
            if not reservation.reused <= n <= reservation.reused + len(reservation.own_slots):
                raise CacheError(f"a request that reused {reservation.reused} tokens and holds "
                                 f"{len(reservation.own_slots)} slots cannot insert {n} tokens")
            result = cache.insert(tokens, reservation.slots(n), agent=intake.agent,
                                  fixed_prefix_tokens=intake.fixed_tokens if intake.agent else None)
    finally:
        # Slots the tree did not take (all of them when nothing was inserted) are still held.
        cache.free_device(cache.still_held(reservation.own_slots))
        cache.unlock(reservation.handle)
    return result


def admission_order(waiting: Sequence[T], returning: Callable[[T], bool], passed: Callable[[T], int],
                    max_passed: int = MAX_PASSED) -> list[T]:
    """``waiting`` (oldest first) in the order to try admitting them: ``returning`` ones (a resident
    continuation's return) first, unless one has been passed over ``max_passed`` times already
    (``passed``): then plain arrival order. The host counts, for each admitted request, one pass
    over every older request still waiting (:func:`passed_over`)."""
    if any(passed(w) >= max_passed for w in waiting):
        return list(waiting)
    ahead = [w for w in waiting if returning(w)]
    if not ahead:
        return list(waiting)
    return ahead + [w for w in waiting if not returning(w)]


def passed_over(waiting: Sequence[T], admitted: T) -> list[T]:
    """The requests of ``waiting`` (oldest first) that ``admitted`` overtook."""
    out = []
    for w in waiting:
        if w is admitted:
            return out
        out.append(w)
    return []


def computed_tokens(prompt: Sequence[int], cached: int, max_new_tokens: int) -> int:
    """Tokens a request computes: the prompt past its reused part (at least the last prompt
    token), and every output token but the last."""
    return len(prompt) - min(cached, len(prompt) - 1) + max_new_tokens - 1
