"""Continuous-batching scheduler: the engine loop's single owner of the cache brain.

One :meth:`Scheduler.step`: apply queued commands (new requests, cancellations, steps updates) and
finished prefetch loads; admit waiting requests (status-aware: a request whose cached prefix is
still loading is skipped and later ones run); spend up to ``chunk_tokens`` of prefill; decode every
running request by one token in one batched forward.

Slot discipline is the brain's request life cycle (:mod:`backends.kvcache.lifecycle`, the one the
simulator follows too): at admission ``reserve`` locks the matched path and allocates every slot the
request can need (rest of the prompt + ``max_tokens - 1``); when it ends, ``release`` inserts what was
computed into the tree and frees the rest, so pool occupancy returns to its baseline after every
request, finished, failed or cancelled.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Callable

from backends.base import EngineBusy, EngineError, FinishReason, StreamEvent
from backends.kvcache import AgentRequest, KVCache, Refused, RequestIntake, Reservation, admission_order, passed_over
from backends.local.config import EngineConfig
from backends.local.model.loader import LoadedModel
from backends.local.pools import KVPool
from backends.local.request import Phase, RequestState
from backends.local.runner import ModelRunner
from backends.local.sampler import sample, shape_logits, token_logprob
from backends.local.tiers import TierMover
from kvflow_orch.protocol import StepsUpdate

__all__ = ["Scheduler"]

log = logging.getLogger("kvflow.engine")


class Scheduler:
    def __init__(self, config: EngineConfig, loaded: LoadedModel, wake: Callable[[], None],
                 load_copy: Callable[[Any], None] | None = None) -> None:
        """``load_copy(task)`` replaces the prefetch worker's host->device copy (fault injection)."""
        device, dtype, cfg = config.torch_device(), config.torch_dtype(), loaded.model.cfg
        self.config = config
        self.device_pool = KVPool(cfg, config.cache.device_tokens, device=device, dtype=dtype)
        self.host_pool = KVPool(cfg, config.cache.host_tokens, device="cpu", dtype=dtype, pin=device.type == "cuda",
                                lazy=True)
        self.cache = KVCache(config.cache)
        self.runner = ModelRunner(loaded.model, self.device_pool, config.chunk_tokens)
        self.tiers = TierMover(self.cache, self.device_pool, self.host_pool, prefetch=config.cache.prefetch, wake=wake,
                               load_copy=load_copy)
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.counters = {"steps": 0, "step_s": 0.0, "decode_steps": 0, "decode_step_s": 0.0,
                         "decode_forward_s": 0.0, "failed_requests": 0}
        self.snapshot: dict[str, Any] = {}
        self._count_lock = threading.Lock()
        self._submitted = 0
        self._ended = 0
        # A failed admission (device pool full of locked KV) is retried only once device slots can
        # have come free: a request ended or a load finished. Retrying every step re-ran the brain's
        # admit for nothing, counting the same prompt's hits and misses again on each try.
        self._admission_stalled = False
        self._publish()

    # ---- commands from other threads (queued; applied by the loop) -----------------------
    def submit(self, state: RequestState) -> None:
        with self._count_lock:
            self._submitted += 1
        self._inbox.put(("submit", state))

    @property
    def in_flight(self) -> int:
        """Requests submitted and not ended yet (their slots are not all back)."""
        with self._count_lock:
            return self._submitted - self._ended

    def cancel(self, state: RequestState) -> None:
        """Abort ``state`` (by identity: request ids are client-chosen on /generate and may repeat)."""
        self._inbox.put(("cancel", state))

    def apply_steps(self, update: StepsUpdate) -> None:
        self._inbox.put(("steps", update))

    def pause(self, request: Any, tools: tuple[str, ...]) -> None:
        """``request``'s reply ended in calls of ``tools``: keep its conversation (the brain's rule)."""
        self._inbox.put(("pause", (request, tools)))

    def inspect(self, fn: Callable[[KVCache], Any], deliver: Callable[[bool, Any], None]) -> None:
        """Run ``fn(cache)`` on the loop thread between steps; ``deliver(ok, value_or_error)``."""
        self._inbox.put(("inspect", (fn, deliver)))

    def flush(self, deliver: Callable[[bool, Any], None]) -> None:
        """Flush the cache on the loop thread between steps when no request is running or waiting;
        ``deliver(True, FlushResult)``, or ``deliver(False, EngineBusy)`` naming what holds it."""
        self._inbox.put(("flush", deliver))

    # ---- the loop body -----------------------------------------------------------------
    def step(self) -> bool:
        """One scheduling iteration; returns whether it did model work or admitted anything."""
        start = time.perf_counter()
        self._drain_inbox()
        if self.tiers.finish_prefetches():
            self._admission_stalled = False
        admitted = self._admit()
        prefilled = self._prefill()
        forward_before = self.runner.forward_s
        decoded = self._decode()
        now = time.perf_counter()
        if decoded and not prefilled and not admitted:
            self.counters["decode_steps"] += 1
            self.counters["decode_step_s"] += now - start
            self.counters["decode_forward_s"] += self.runner.forward_s - forward_before
        self.counters["steps"] += 1
        self.counters["step_s"] += now - start
        self._publish()
        return admitted or prefilled or decoded

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or not self._inbox.empty())

    def fail_all(self, exc: BaseException) -> None:
        """End every queued and running request with ``exc`` (after an unexpected loop error)."""
        for state in list(self.waiting) + list(self.running):
            self._fail(state, exc)

    def shutdown(self) -> None:
        self._drain_inbox()
        self.fail_all(EngineError("the engine shut down"))
        self.tiers.stop()
        self._publish()

    # ---- commands -----------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        hinted = False
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                break
            try:
                if kind == "submit":
                    hinted |= self._accept(payload)
                elif kind == "cancel":
                    self._cancel(payload)
                elif kind == "steps":
                    self.cache.apply_steps(payload)
                    hinted = True
                elif kind == "pause":
                    request, tools = payload
                    session = RequestIntake.session_of(request.hint, request.session)
                    if session is not None:
                        self.cache.pause(session, tools)
                elif kind == "inspect":
                    self._inspect(*payload)
                elif kind == "flush":
                    self._flush(payload)
            except Exception as exc:  # a bad command must not stop the loop
                log.warning("ignored %s command: %s", kind, exc)
                if kind == "submit":
                    self._fail(payload, exc)
        if hinted:
            self.tiers.plan_prefetch()

    def _accept(self, state: RequestState) -> bool:
        request = state.request
        state.intake = self.cache.accept(AgentRequest(state.cache_key(state.prompt), request.hint,
                                                       request.fixed_prefix_tokens, request.session))
        self.waiting.append(state)
        return request.hint is not None

    def _inspect(self, fn: Callable[[KVCache], Any], deliver: Callable[[bool, Any], None]) -> None:
        try:
            value = fn(self.cache)
        except Exception as exc:
            deliver(False, exc)
        else:
            deliver(True, value)

    def _flush(self, deliver: Callable[[bool, Any], None]) -> None:
        if self.running or self.waiting:
            deliver(False, EngineBusy(f"not flushed: {len(self.running)} running and {len(self.waiting)} waiting "
                                      "requests hold the cache; retry when idle"))
            return
        try:
            result = self.cache.flush()
        except Exception as exc:  # reported to the caller, the loop keeps serving
            deliver(False, exc)
            return
        self._publish()
        deliver(True, result)

    def _cancel(self, state: RequestState) -> None:
        if state.phase is not Phase.DONE:
            self._finish(state, "abort")

    # ---- admission ----------------------------------------------------------------------
    def _admit(self) -> bool:
        admitted = False
        for state in admission_order(self.waiting, self._resident_return, _passed):
            if len(self.running) >= self.config.max_batch or self._admission_stalled:
                break
            try:
                outcome = self.cache.reserve(state.cache_key(state.prompt), state.request.sampling.max_tokens)
                if isinstance(outcome, Refused):
                    self.tiers.demote(outcome.evicted)
                    if outcome.loading:
                        continue  # its prefix is being prefetched: let ready requests run meanwhile
                    self._admission_stalled = True  # device pool full of locked KV: wait for running requests to finish
                    break
                self._start(state, outcome)
            except Exception as exc:
                self._fail(state, exc)
                continue
            admitted = True
        return admitted

    def _resident_return(self, state: RequestState) -> bool:
        return self.cache.returns_resident(state.cache_key(state.prompt), state.intake)

    def _start(self, state: RequestState, reservation: Reservation) -> None:
        state.reservation = reservation  # from here on, every ending gives it back
        for older in passed_over(self.waiting, state):
            older.passed_over += 1
        self.tiers.demote(reservation.evicted)
        if reservation.load is not None:  # host-only prefix: load it now (the stall prefetch avoids)
            self.tiers.load_now(reservation.load)
        state.cached_tokens = state.computed = reservation.reused
        state.phase = Phase.PREFILL
        self.waiting.remove(state)
        self.running.append(state)

    # ---- model work ---------------------------------------------------------------------
    def _prefill(self) -> bool:
        budget = self.config.chunk_tokens
        worked = False
        for state in [s for s in self.running if s.phase is Phase.PREFILL]:
            if budget <= 0:
                break
            start = state.computed
            end = min(len(state.prompt), start + budget)
            try:
                logits = self.runner.prefill(state.prompt[start:end], state.slots(start), state.slots(end)[start:])
                state.computed, budget, worked = end, budget - (end - start), True
                if end == len(state.prompt):
                    state.phase = Phase.DECODE
                    self._emit(state, logits)
            except Exception as exc:
                self._fail(state, exc)
        return worked

    def _decode(self) -> bool:
        batch = [s for s in self.running if s.phase is Phase.DECODE]
        if not batch:
            return False
        positions = [len(s.prompt) + len(s.outputs) - 1 for s in batch]
        try:
            logits = self.runner.decode([s.outputs[-1] for s in batch],
                                        [s.slots(p + 1) for s, p in zip(batch, positions, strict=True)])
        except Exception as exc:
            for state in batch:
                self._fail(state, exc)
            return True
        for state, row in zip(batch, logits, strict=True):
            try:
                self._emit(state, row)
            except Exception as exc:  # fail this request only; raising here would stall the whole batch forever
                self._fail(state, exc)
        return True

    # ---- endings ------------------------------------------------------------------------
    def _emit(self, state: RequestState, logits: Any) -> None:
        """Sample the next token from ``logits`` ``[vocab]`` and deliver it."""
        sampling = state.request.sampling
        shaped = shape_logits(logits, sampling, state.prompt, state.outputs)
        grammar = state.grammar
        if grammar is None:
            token = sample(shaped, sampling, state.generator)
        else:  # constrained decoding: sample among the tokens the grammar allows, then let it finish in budget
            token = sample(grammar.mask(shaped), sampling, state.generator)
            token = grammar.advance(token, sampling.max_tokens - len(state.outputs))
        logprob = None if sampling.logprobs is None else token_logprob(logits, token, sampling.logprobs)
        if logprob is not None:
            state.logprobs.append(logprob)
        reason = state.push_token(token)
        if reason is None and state.grammar is not None and state.grammar.terminated:
            reason = "stop"
        if reason is not None:
            self._finish(state, reason, token)
        else:
            state.sink(StreamEvent(token, state.take_delta(final=False), logprob=logprob))

    def _finish(self, state: RequestState, reason: FinishReason, token: int | None = None) -> None:
        self._release(state, keep=True)
        self._publish()
        logprob = state.logprobs[-1] if token is not None and state.logprobs else None
        state.sink(StreamEvent(token, state.take_delta(final=True), state.result(reason), logprob=logprob))

    def _fail(self, state: RequestState, exc: BaseException) -> None:
        self.counters["failed_requests"] += 1
        try:
            self._release(state, keep=False)
        finally:
            self._publish()
            state.sink(exc)

    def _release(self, state: RequestState, *, keep: bool) -> None:
        """Give back everything ``state`` holds; with ``keep``, first cache the KV it computed."""
        if state.phase is Phase.DONE:
            return
        if state in self.running:
            self.running.remove(state)
        elif state in self.waiting:
            self.waiting.remove(state)
        state.phase = Phase.DONE
        self._admission_stalled = False
        try:
            self._give_back(state, keep)
        finally:
            with self._count_lock:
                self._ended += 1

    def _give_back(self, state: RequestState, keep: bool) -> None:
        reservation, state.reservation = state.reservation, None
        if reservation is None:
            return
        computed = None
        if keep:  # the KV of every position but the last output token was computed
            kept = (state.prompt + tuple(state.outputs))[:state.computed + max(0, len(state.outputs) - 1)]
            computed = state.cache_key(kept)
        try:
            result = self.cache.release(reservation, computed, state.intake)
        except Exception:  # the brain gave the slots and the lock back all the same
            log.exception("could not cache request %s; dropping its KV", state.request_id)
            return
        if result is not None and result.offload is not None:
            self.tiers.offload_now(result.offload)

    def _publish(self) -> None:
        # continuations_* counters come with the intake's; "continuations" is how many are kept now
        intake = self.cache.intake.snapshot()
        self.snapshot = {
            **self.cache.stats.as_dict(), **self.cache.usage(), **intake["counters"],
            "agents_with_prefix": intake["agents_with_prefix"], "continuations": intake["continuations"],
            "running": len(self.running), "waiting": len(self.waiting),
            "forward_s": self.runner.forward_s, "prefetch_tasks": self.tiers.prefetch_tasks,
            "h2d_tokens": self.tiers.h2d_tokens, "d2h_tokens": self.tiers.d2h_tokens, **self.counters,
        }


def _passed(state: RequestState) -> int:
    return state.passed_over
