"""Record the calls an engine makes on its cache brain; replay them through a fresh brain.

A replay answers "what would another eviction policy, or another pool size, have done on exactly
these requests?" without the model: the brain decides hits and evictions from token ids, hints and
sizes alone. With :class:`~.policy.BeladyPolicy` given the recorded admissions as its future, it
gives the offline-optimal eviction order on the same trace (the bound no online policy can beat);
with a pool large enough to hold everything, the tokens that any policy must compute (each
prompt's dynamic part and the first, cold use of each fixed prefix).

Two recordings:

* :class:`ScheduleRecorder` (any host that drives the brain through ``reserve``/``release``, the
  simulator and the embedded engine; concurrent requests too): the schedule the run executed,
  each admission and each release in order. :func:`replay_schedule` runs exactly that schedule
  through a fresh brain: with the run's own policy it reproduces the run's recomputed tokens (the
  requests' locks and rooms are the same), and with ``belady=True`` it gives Bélády's eviction on
  *that* schedule, so every policy is compared with the offline order on the requests, the
  concurrency and the admission order it saw itself (a policy changes timing, hence the schedule:
  Bélády on another run's schedule is no bound for this one). An attempt the run refused (no room
  yet) is replayed for its eviction, except under Bélády: the oracle makes room only when a request
  is admitted. Under Bélády a schedule is refused (:class:`TraceError`) if an admission finds no
  room (cannot happen when concurrent requests share no prefix: each then locks what it did);
* :class:`BrainRecorder` (every brain call of a sequential trace, hints included), below.

Scope of :func:`replay`: sequential traces without a host tier (one request between ``admit`` and ``unlock`` at a
time, as a workflow that runs one LLM call after another): eviction is then the only lever, and
the request order does not depend on the policy. The replay drives the brain through the request
life cycle the engine uses (:mod:`.lifecycle`): ``reserve`` with the recorded decode room,
``release`` of the recorded tokens with the recorded agent and fixed boundary. A recording that
breaks these rules is refused with a :class:`TraceError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from .cache import KVCache
from .config import CacheConfig
from .errors import CacheError
from .hints import AgentRef
from .intake import UNHINTED, AgentRequest, IntakeDecision
from .lifecycle import Refused, Reservation, computed_tokens
from .results import MatchResult
from .policy import BeladyPolicy, EvictionPolicy

__all__ = ["TraceError", "RecordedRequest", "BrainRecorder", "replay", "ScheduleRecorder", "replay_schedule"]


class TraceError(CacheError):
    """A recording the replay cannot follow (concurrent requests, a call out of order)."""


@dataclass
class RecordedRequest:
    """One request as the engine drove the brain: the prompt, how many of its tokens the engine
    reused from the cache, how many slots it asked for, what it inserted."""

    prompt: tuple[int, ...]
    reused: int = 0
    alloc: int | None = None
    inserted: tuple[int, ...] | None = None
    agent: AgentRef | None = None
    fixed_prefix_tokens: int | None = None

    @property
    def decode_room(self) -> int:
        """Slots beyond the computed prompt tokens (the generated tokens' room)."""
        assert self.alloc is not None
        return self.alloc - (len(self.prompt) - self.reused)


@dataclass
class BrainRecorder:
    """Wraps one :class:`KVCache` instance's ``accept``, ``apply_hint``, ``apply_steps``,
    ``admit``, ``alloc_device`` and ``insert`` (the originals still run; ``reserve`` and
    ``release`` call them) and keeps the calls in order in
    ``events``: ``("hint", KVFlowHint)``, ``("steps", StepsUpdate)``, ``("request", RecordedRequest)``."""

    cache: KVCache
    events: list[tuple[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        cache, events = self.cache, self.events
        admit, alloc, insert = cache.admit, cache.alloc_device, cache.insert
        accept, apply_hint, apply_steps = cache.accept, cache.apply_hint, cache.apply_steps
        self._open: RecordedRequest | None = None

        def on_accept(request: AgentRequest) -> IntakeDecision:
            decision = accept(request)
            if request.hint is not None:
                events.append(("hint", request.hint))
            return decision

        def on_hint(hint: KVFlowHint) -> None:
            apply_hint(hint)
            events.append(("hint", hint))

        def on_steps(update: StepsUpdate) -> None:
            apply_steps(update)
            events.append(("steps", update))

        def on_admit(tokens: Sequence[int]):
            if self._open is not None and self._open.inserted is None:
                events.append(("overlap", None))  # an admission before the last request ended
            adm = admit(tokens)
            prompt = tuple(tokens)
            self._open = RecordedRequest(prompt, reused=min(len(adm.prefix_slots), len(prompt) - 1))
            events.append(("request", self._open))
            return adm

        def on_alloc(n: int):
            if self._open is not None and self._open.alloc is None:
                self._open.alloc = n
            return alloc(n)

        def on_insert(tokens: Sequence[int], device_slots: Sequence[int], **kw: Any):
            result = insert(tokens, device_slots, **kw)
            if self._open is not None and self._open.inserted is None:
                agent = kw.get("agent")
                self._open.inserted = tuple(tokens)
                self._open.agent = agent
                # the boundary tagged (an inferred one too), so the replay tags the same
                self._open.fixed_prefix_tokens = None if agent is None else cache.intake.prefixes.tokens(agent)
            return result

        cache.accept, cache.apply_hint, cache.apply_steps = on_accept, on_hint, on_steps
        cache.admit, cache.alloc_device, cache.insert = on_admit, on_alloc, on_insert

    @property
    def requests(self) -> list[RecordedRequest]:
        return [payload for kind, payload in self.events if kind == "request"]


def replay(events: Sequence[tuple[str, Any]], config: CacheConfig, *, belady: bool = False,
           policy: EvictionPolicy | None = None) -> KVCache:
    """Replay recorded ``events`` through a fresh brain built from ``config`` (its policy, or
    ``policy``, or with ``belady=True`` Bélády's offline-optimal order given the recorded prompts
    as the future) and return it; its ``stats`` hold the replayed hits and recomputed tokens.
    Hint TTLs do not expire during a replay (its clock stands still)."""
    if config.has_host_tier:
        raise ValueError("replay covers traces without a host tier (host_tokens=0): "
                         "loads and demotions are not replayed")
    if any(kind == "overlap" for kind, _ in events):
        raise TraceError("the recording has overlapping requests (admitted before the previous one ended, "
                         "or admitted again after a refused allocation): the replay follows sequential traces")
    requests = [p for kind, p in events if kind == "request"]
    for i, r in enumerate(requests):
        if r.alloc is None or r.inserted is None or len(r.prompt) < 1:
            raise TraceError(f"recorded request {i} is incomplete (admit without alloc_device/insert): "
                             "the replay needs one complete request at a time")
    if belady:
        policy = BeladyPolicy([r.prompt for r in requests])
    cache = KVCache(replace(config, prefetch=False), clock=lambda: 0.0, policy=policy)
    for kind, payload in events:
        if kind == "hint":
            cache.apply_hint(payload)
        elif kind == "steps":
            cache.apply_steps(payload)
        elif kind == "request":
            _replay_request(cache, payload)
        else:
            raise TraceError(f"unknown recorded event {kind!r}")
    return cache


def _replay_request(cache: KVCache, r: RecordedRequest) -> None:
    reservation = cache.reserve(r.prompt, r.decode_room + 1)
    if isinstance(reservation, Refused):
        raise TraceError(f"replay: no room for a request of {len(r.prompt)} tokens in a "
                         f"{cache.config.device_tokens}-token pool")
    assert r.inserted is not None
    n = len(r.inserted)
    if n < reservation.reused or n - reservation.reused > len(reservation.own_slots):
        raise TraceError(f"recorded insert of {n} tokens does not fit a request that reused {reservation.reused}")
    cache.release(reservation, r.inserted, IntakeDecision(r.agent, r.fixed_prefix_tokens or 0))


# ---- schedules: admissions and releases of concurrent requests ------------------------------
@dataclass
class ScheduleRecorder:
    """Wraps one :class:`KVCache` instance's ``reserve``, ``release`` and ``match_prefix`` (the
    originals still run) and keeps, in order, ``("admit", i, prompt, max_new_tokens)`` for the
    ``i``-th admitted request, ``("refused", prompt, max_new_tokens)`` for an attempt refused for
    room, ``("release", i, tokens, agent, fixed_tokens)`` (``tokens``: what it inserted, ``None``:
    nothing; its first ``fixed_tokens`` tagged as ``agent``'s fixed prefix) and ``("peek",
    tokens)`` for a prefix match (a host's look at a waiting request). Tags and peeks split tree
    nodes at their boundaries, and a node is what eviction takes whole: the replay splits where
    the run did, so that with the same policy it evicts the very same tokens."""

    cache: KVCache
    events: list[tuple[Any, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        cache, events = self.cache, self.events
        reserve, release, match_prefix = cache.reserve, cache.release, cache.match_prefix
        index: dict[int, int] = {}  # id(reservation) -> its admission's number
        admitted = 0

        def on_reserve(prompt: Sequence[int], max_new_tokens: int, **kw: Any) -> Reservation | Refused:
            nonlocal admitted
            outcome = reserve(prompt, max_new_tokens, **kw)
            if isinstance(outcome, Refused):
                if not outcome.loading:
                    events.append(("refused", tuple(prompt), max_new_tokens))
                return outcome
            index[id(outcome)] = admitted
            events.append(("admit", admitted, tuple(prompt), max_new_tokens))
            admitted += 1
            return outcome

        def on_release(reservation: Reservation, tokens: Sequence[int] | None,
                       intake: IntakeDecision = UNHINTED):
            i = index.pop(id(reservation), None)
            if i is None:
                raise TraceError("release of a reservation the recorder did not see admitted")
            events.append(("release", i, None if tokens is None else tuple(tokens), intake.agent,
                           intake.fixed_tokens if intake.agent is not None else 0))
            return release(reservation, tokens, intake)

        def on_match(tokens: Sequence[int]) -> MatchResult:
            if not events or events[-1][0] != "peek" or events[-1][1] != tokens:
                events.append(("peek", tokens if isinstance(tokens, tuple) else tuple(tokens)))
            return match_prefix(tokens)

        cache.reserve, cache.release, cache.match_prefix = on_reserve, on_release, on_match

    @property
    def admissions(self) -> list[tuple[int, ...]]:
        """Admitted prompts in order (Bélády's future on this schedule)."""
        return [event[2] for event in self.events if event[0] == "admit"]


def replay_schedule(events: Sequence[tuple[Any, ...]], config: CacheConfig, *, belady: bool = False,
                    policy: EvictionPolicy | None = None) -> KVCache:
    """Run a recorded schedule (:class:`ScheduleRecorder`) through a fresh brain built from
    ``config`` (its policy, or ``policy``, or with ``belady=True`` Bélády's order given the
    schedule's admissions as the future) and return it; its ``stats`` hold the replayed hits and
    recomputed tokens. Requests carry no hints (LRU and Bélády need none); refused attempts are
    replayed for their eviction except under Bélády (module docstring); tags and peeks split
    nodes where the run did."""
    if config.has_host_tier:
        raise ValueError("replay_schedule covers runs without a host tier (host_tokens=0)")
    if belady:
        policy = BeladyPolicy([e[2] for e in events if e[0] == "admit"])
    cache = KVCache(replace(config, prefetch=False, continuations=False), clock=lambda: 0.0, policy=policy)
    open_: dict[int, Reservation] = {}
    for event in events:
        kind = event[0]
        if kind == "admit":
            _, i, prompt, max_new = event
            reservation = cache.reserve(prompt, max_new)
            if isinstance(reservation, Refused):
                raise TraceError(f"replay_schedule: admission {i} ({len(prompt)} prompt tokens) finds no room "
                                 f"in the {config.device_tokens}-token pool: the requests running then lock more "
                                 "than the recorded run's did")
            open_[i] = reservation
        elif kind == "refused":
            if not belady:
                _make_room(cache, event[1], event[2])
        elif kind == "release":
            _, i, tokens, agent, fixed = event
            reservation = open_.pop(i, None)
            if reservation is None:
                raise TraceError(f"replay_schedule: release of request {i}, which is not running")
            cache.release(reservation, tokens, IntakeDecision(agent, fixed))
        elif kind == "peek":
            cache.match_prefix(event[1])
        else:
            raise TraceError(f"unknown schedule event {kind!r}")
    return cache


def _make_room(cache: KVCache, prompt: Sequence[int], max_new_tokens: int) -> None:
    """The eviction a refused ``reserve`` did (its room-making), without admitting anything."""
    match = cache.match_prefix(prompt)
    need = computed_tokens(prompt, match.cached_tokens, max_new_tokens)
    cache.lock(match.handle)
    try:
        if cache.device.free_count < need:
            cache.evict_device(need - cache.device.free_count)
    finally:
        cache.unlock(match.handle)
