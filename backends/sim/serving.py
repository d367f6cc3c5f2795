"""A simulated serving instance: one compute stream, a full-duplex host link, continuous batching.

Every cache decision is the shared brain's (:class:`backends.kvcache.KVCache`): the intake of a
request's hint, prefix matching, hit accounting, eviction order, load planning, prefetch planning,
readiness, and the request life cycle (``reserve``/``release``, :mod:`backends.kvcache.lifecycle`),
which the embedded engine follows in the same order. The simulator only adds time: forward passes
from the roofline :class:`~.cost.CostModel`, copies from :class:`~.link.Link`.

Scheduling, once per iteration of the compute stream:

1. walk the waiting queue in the brain's admission order (arrival order, except that a return to a
   kept conversation still on device goes first, :func:`~backends.kvcache.admission_order`); with
   ``status_aware`` a request whose prefix is still loading is skipped (it stays queued) and later
   ready requests are considered; without it, the walk stops there (FCFS). A request is admitted
   when the brain reserves device slots for every token it computes (the engine's rule: the prompt
   past its reused prefix, the output but its last token), within a per-iteration budget of prompt
   tokens to compute;
2. run one forward pass over the admitted prefills and one decode token of every running request.
   A load the brain started at admission overlaps the pass layer by layer, so the pass ends no
   earlier than that load plus one layer's compute. With no prefill to run, decode steps are taken
   in bulk up to the next event (nothing can change the batch in between).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from backends.kvcache import (UNHINTED, AgentRequest, CacheConfig, IntakeDecision, KVCache, MatchResult, Refused,
                              Reservation, admission_order, passed_over)
from backends.kvcache.hints import AgentRef
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from .cost import CostModel, Work
from .events import EventQueue
from .link import Link
from .systems import System

__all__ = ["SimRequest", "EngineLimits", "ServingSim"]


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler limits: most prompt tokens computed per iteration (cached ones are free; a request
    with more to compute runs alone) and most requests running at once."""

    max_prefill_tokens: int = 16384
    max_running: int = 256


@dataclass(eq=False)
class SimRequest:
    """One LLM call. ``on_done(request)`` fires when its last token is generated."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    agent: AgentRef
    fixed_tokens: int
    hint: KVFlowHint | None
    on_done: Callable[["SimRequest"], None]
    arrival_s: float = 0.0
    admitted_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    cached_tokens: int = 0  # prompt tokens reused from the cache
    generated: int = 0
    intake: IntakeDecision = UNHINTED  # the brain's decision at arrival (agent, fixed boundary)
    reservation: Reservation | None = None  # its slots and prefix lock, held while running
    session: str | None = None  # an explicit session key (plain traffic's user / prompt_cache_key)
    passed_over: int = 0  # times a returning continuation was admitted ahead of it

    @property
    def context(self) -> int:
        return len(self.prompt) + self.generated


@dataclass
class _Busy:
    compute_s: float = 0.0


class ServingSim:
    def __init__(
        self,
        system: System,
        cost: CostModel,
        cache_config: CacheConfig,
        *,
        limits: EngineLimits = EngineLimits(),
        events: EventQueue | None = None,
        policy=None,
        on_submit: Callable[[SimRequest], None] | None = None,
    ) -> None:
        """``on_submit`` sees every request as it arrives (calibration replays them on the real engine)."""
        self.system = system
        self.cost = cost
        self.limits = limits
        self.events = events if events is not None else EventQueue()  # an empty queue is falsy
        self.cache = KVCache(cache_config, clock=lambda: self.events.now, policy=policy)
        self.h2d = Link(self.events, cost.transfer_time)
        self.d2h = Link(self.events, cost.transfer_time)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.busy = _Busy()
        self._computing = False
        self._step_pending = False
        self._plan_pending = False
        self.admission_log: list[tuple[int, ...]] = []
        self.on_submit = on_submit

    # ---- client side ----------------------------------------------------------------------
    def submit(self, request: SimRequest) -> None:
        """A request arrives now: its hint reaches the brain at once, then it queues. A request
        that could never fit in the device pool is refused (ValueError) instead of waiting forever."""
        need = len(request.prompt) + len(request.output)
        if need > self.cache.config.device_tokens:
            raise ValueError(f"a request of {need} tokens (prompt + output) can never fit in the device pool "
                             f"of {self.cache.config.device_tokens} tokens; raise --device-tokens")
        request.arrival_s = self.events.now
        if self.on_submit is not None:
            self.on_submit(request)
        request.intake = self.cache.accept(AgentRequest(request.prompt, request.hint, request.fixed_tokens,
                                                        request.session))
        if request.hint is not None:
            self._prefetch()
        self.waiting.append(request)
        self._kick()

    def steps_update(self, update: StepsUpdate) -> None:
        self.cache.apply_steps(update)
        self._prefetch()

    # ---- transfers ------------------------------------------------------------------------
    def _prefetch(self) -> None:
        """Plan prefetches once for everything that happened at this instant (hint updates,
        finished requests, completed loads), before the scheduler step of the same instant."""
        if self.system.prefetch and not self._plan_pending:
            self._plan_pending = True
            self.events.schedule(self.events.now, self._plan)

    def _plan(self) -> None:
        self._plan_pending = False
        plan = self.cache.plan_prefetch()
        self._honour(plan.evicted)
        for task in plan.tasks:
            self.h2d.background(task.tokens, lambda t=task: self._loaded(t))

    def _loaded(self, task) -> None:
        self.cache.complete_load(task)
        self._prefetch()
        self._kick()

    def _honour(self, evicted) -> float:
        """Write-back demotions must reach host before their device slots are reused."""
        end = self.events.now
        for demotion in evicted.demoted:
            end = self.d2h.demand(len(demotion.device_slots), _noop)
        return end

    def _offload(self, task) -> None:
        if task is not None:
            self.d2h.background(len(task.device_slots), lambda: self._offloaded(task))

    def _offloaded(self, task) -> None:
        # An offloading node cannot be evicted: a request waiting for room may fit now.
        self.cache.complete_offload(task)
        self._kick()

    # ---- compute stream -------------------------------------------------------------------
    def _kick(self) -> None:
        # Deferred to an event at the same instant, so every request arriving now joins one batch.
        if not self._computing and not self._step_pending:
            self._step_pending = True
            self.events.schedule(self.events.now, self._step)

    def _admit(self, request: SimRequest, peek: MatchResult) -> tuple[bool, float]:
        """Try to admit; ``peek`` is the request's prefix match at this instant. Returns
        (admitted, time its KV is ready: load/demotion end)."""
        outcome = self.cache.reserve(request.prompt, len(request.output), match=peek)
        ready_at = self._honour(outcome.evicted)
        if isinstance(outcome, Refused):
            return False, ready_at
        load = outcome.load
        if load is not None:
            ready_at = max(ready_at, self.h2d.demand(load.tokens, lambda: self.cache.complete_load(load)))
        request.reservation = outcome
        request.cached_tokens = outcome.reused
        request.admitted_s = self.events.now
        self.admission_log.append(request.prompt)
        return True, ready_at

    def _resident_return(self, request: SimRequest) -> bool:
        return self.cache.returns_resident(request.prompt, request.intake)

    def _step(self) -> None:
        self._step_pending = False
        if self._computing:
            return
        now = self.events.now
        admitted: list[SimRequest] = []
        ready_at = now
        budget = self.limits.max_prefill_tokens
        for request in admission_order(self.waiting, self._resident_return, _passed):
            if len(self.running) + len(admitted) >= self.limits.max_running:
                break
            peek = self.cache.match_prefix(request.prompt)
            if not self.cache.is_ready(peek):
                if self.system.status_aware:
                    continue
                break
            # The budget counts tokens to compute, as SGLang's PrefillAdder does: a cached prefix is free.
            if admitted and _to_compute(request.prompt, peek.cached_tokens) > budget:
                break
            ok, at = self._admit(request, peek)
            if not ok:
                break
            for older in passed_over(self.waiting, request):
                older.passed_over += 1
            self.waiting.remove(request)
            admitted.append(request)
            ready_at = max(ready_at, at)
            budget -= _to_compute(request.prompt, request.cached_tokens)
            if budget <= 0:
                break
        if admitted:
            work = [Work(_to_compute(r.prompt, r.cached_tokens), r.cached_tokens) for r in admitted]
            work += [Work(1, r.context) for r in self.running]
            seconds = self.cost.forward_time(work)
            end = max(now + seconds, ready_at + self.cost.layer_time(seconds))
            self._run(end, seconds, admitted, 1)
        elif self.running:
            k = min(len(r.output) - r.generated for r in self.running)
            mid = [r.context + (k - 1) / 2 for r in self.running]
            seconds = self.cost.decode_time(mid)
            nxt = self.events.next_time()
            if nxt is not None and nxt > now:
                k = max(1, min(k, math.ceil((nxt - now) / seconds)))
            elif nxt is not None:
                k = 1
            self._run(now + k * seconds, k * seconds, [], k)

    def _run(self, end: float, compute_s: float, admitted: list[SimRequest], k: int) -> None:
        self._computing = True
        self.busy.compute_s += compute_s
        self.events.schedule(end, self._iteration_done, admitted, k)

    def _iteration_done(self, admitted: list[SimRequest], k: int) -> None:
        now = self.events.now
        for r in self.running:
            r.generated += k
        for r in admitted:
            r.generated = 1
            r.first_token_s = now
        self.running.extend(admitted)
        finished = [r for r in self.running if r.generated >= len(r.output)]
        self.running = [r for r in self.running if r.generated < len(r.output)]
        self._computing = False
        for r in finished:
            self._finish(r)
        for r in finished:
            r.on_done(r)
        if finished:
            self._prefetch()
        self._kick()

    def _finish(self, r: SimRequest) -> None:
        r.finish_s = self.events.now
        reservation, r.reservation = r.reservation, None
        computed = (r.prompt + r.output)[:-1]  # the last output token's KV is never computed
        res = self.cache.release(reservation, computed, r.intake)
        self._offload(res.offload if res is not None else None)


def _to_compute(prompt: tuple[int, ...], cached: int) -> int:
    # A fully cached prompt still computes its last token to produce the first output logits.
    return max(1, len(prompt) - cached)


def _passed(request: SimRequest) -> int:
    return request.passed_over


def _noop() -> None:
    return None
