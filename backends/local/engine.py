"""The embedded engine's facade: :class:`Engine` implements ``backends.base.ServingEngine``.

Model work runs on a dedicated loop thread (it never blocks the asyncio loop); callers talk to it
through the scheduler's command queue and receive events through a thread-safe sink bound to their
own event loop. Cancelling an awaiting ``generate`` task or closing a ``stream`` iterator aborts the
request and frees its slots.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Sequence, TypeVar

from backends.base import EngineError, GenerateRequest, GenerateResult, RequestTooLarge, StreamEvent
from backends.local.config import EngineConfig
from backends.local.grammar import Grammars
from backends.local.model.loader import load_model
from backends.local.request import RequestState
from backends.local.sampler import make_generator
from backends.local.scheduler import Scheduler
from backends.local.tokenizer import ChatTokenizer
from kvflow_orch.protocol import StepsUpdate

__all__ = ["Engine"]

log = logging.getLogger("kvflow.engine")
_IDLE_WAIT_S = 0.5
T = TypeVar("T")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvflow")
    except PackageNotFoundError:
        return "0+unknown"


def _in_passing_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run on a thread that exits once it returns (its exception re-raised here).

    The model runs on the loop thread. Loading it (casts, pool allocation: parallel torch ops) on the
    caller's thread would leave that thread an OpenMP worker team for the life of the process; with
    two teams alive, more OpenMP threads exist than a small machine has cores, and libgomp then
    stops spin-waiting between parallel regions: every op of every forward pays a futex wake-up.
    On 2 cores that made a SmolLM2 decode step ~1.7x and a 1k-token prefill ~1.6x slower than the
    same forwards on the loading thread. A thread's team is released when the thread ends, so only
    the loop thread's remains."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvflow-engine-load") as loader:
        return loader.submit(fn).result()  # the worker thread has exited once the pool is shut down


class Engine:
    """``Engine(EngineConfig(...))`` loads the model at construction; ``start()`` (or the first
    request) starts the loop thread; ``shutdown()`` fails what is still queued and stops it."""

    def __init__(self, config: EngineConfig | None = None, *, load_copy: Callable[[Any], None] | None = None) -> None:
        """``load_copy(task)``, when given, performs the prefetch worker's host->device copies instead
        of the built-in one: a seam for injecting copy faults (tests, fault drills)."""
        self.config = config or EngineConfig()
        self._wake = threading.Event()

        def build() -> tuple[Any, Scheduler, Grammars]:
            loaded = load_model(self.config.model, dtype=self.config.torch_dtype(), device=self.config.torch_device(),
                                seed=self.config.seed)
            return (loaded, Scheduler(self.config, loaded, self._wake.set, load_copy),
                    Grammars(loaded.tokenizer, loaded.model.cfg.vocab_size))

        loaded, self.scheduler, self.grammars = _in_passing_thread(build)
        self.model_name = loaded.name
        self.tokenizer: ChatTokenizer = loaded.tokenizer
        self.model_config = loaded.model.cfg
        self._thread: threading.Thread | None = None
        self._stop = False
        self._lock = threading.Lock()
        # Unseeded sampled requests draw their seed from a generator seeded per process: different
        # on every restart and replica, and never the predictable 1, 2, 3... a user may also pick.
        self._seeds = random.Random(secrets.randbits(64))

    # ---- life cycle -------------------------------------------------------------------
    async def start(self) -> None:
        self._ensure_started()

    def _ensure_started(self, enqueue: Callable[[], None] | None = None) -> None:
        """Start the loop thread if needed, then run ``enqueue`` (queue a scheduler command) under the
        lock ``close`` takes: a command queued before the engine stops is drained by its shutdown (the
        request failed, the inspection answered), never left in a queue nobody reads any more."""
        with self._lock:
            if self._stop:
                raise EngineError("the engine has been shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kvflow-engine", daemon=True)
                self._thread.start()
            if enqueue is not None:
                enqueue()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Synchronous shutdown (idempotent)."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()
        else:
            self.scheduler.shutdown()

    def _loop(self) -> None:
        scheduler = self.scheduler
        while not self._stop:
            self._wake.clear()
            try:
                progressed = scheduler.step()
            except Exception as exc:  # keep serving: end what was in flight (slots freed), not the loop
                log.exception("engine step failed")
                scheduler.fail_all(EngineError(f"internal engine error: {type(exc).__name__}: {exc}"))
                progressed = False
            if not progressed:
                self._wake.wait(_IDLE_WAIT_S)
        scheduler.shutdown()

    # ---- requests ---------------------------------------------------------------------
    def _validate(self, request: GenerateRequest) -> None:
        ids, sampling = request.input_ids, request.sampling
        if not ids:
            raise EngineError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise EngineError(f"token id {bad!r} is outside the vocabulary [0, {vocab})")
        needed = len(ids) + sampling.max_tokens - 1
        limit = min(self.config.cache.device_tokens, self.model_config.max_position)
        if needed > limit:
            raise RequestTooLarge(
                f"the prompt has {len(ids)} tokens and max_tokens is {sampling.max_tokens}: {needed} KV slots are "
                f"needed but the limit is {limit} (device pool {self.config.cache.device_tokens} tokens, "
                f"context {self.model_config.max_position})"
            )
        bad = next((t for t, _ in sampling.logit_bias if not 0 <= t < vocab), None)
        if bad is not None:
            raise EngineError(f"logit_bias: token id {bad} is outside the vocabulary [0, {vocab})")
        fixed = request.fixed_prefix_tokens
        if fixed is not None and not 0 <= fixed <= len(ids):
            raise EngineError(f"fixed_prefix_tokens is {fixed} but the prompt has {len(ids)} tokens")

    def _submit(
        self, request: GenerateRequest, grammar: Any = None,
    ) -> tuple[RequestState, asyncio.Queue[StreamEvent | BaseException]]:
        self._validate(request)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()

        def sink(event: StreamEvent | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the caller's loop is gone: nobody is listening any more
                self.scheduler.cancel(state)
                self._wake.set()

        with self._lock:
            fallback_seed = self._seeds.getrandbits(63)
        state = RequestState(request, sink, self.tokenizer, make_generator(request.sampling, fallback_seed),
                             grammar=grammar)
        self._ensure_started(lambda: self.scheduler.submit(state))
        self._wake.set()
        return state, events

    async def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]:
        grammar = None
        if request.constraint is not None:  # compiled off the event loop (and off the engine loop)
            self._validate(request)
            grammar = await asyncio.to_thread(self.grammars.start, request.constraint)
        state, events = self._submit(request, grammar)
        finished = False
        try:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    finished = True
                    raise event
                # Set before yielding: a caller that stops at the last event (generate does) closes us
                # at this yield, and that must not send a pointless cancel.
                finished = event.result is not None
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.scheduler.cancel(state)
                self._wake.set()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        events = self.stream(request)
        try:
            async for event in events:
                if event.result is not None:
                    return event.result
        finally:
            await events.aclose()
        raise EngineError("the request ended without a result")

    def apply_steps(self, update: StepsUpdate) -> None:
        if not isinstance(update, StepsUpdate):
            raise TypeError(f"apply_steps expects a StepsUpdate, got {type(update).__name__}")
        self.scheduler.apply_steps(update)
        self._wake.set()

    def pause(self, request: GenerateRequest, tools: Sequence[str]) -> None:
        """``request`` ended and its reply calls ``tools``: the brain keeps its conversation for the
        agent's return (:mod:`backends.kvcache.continuations`). The server calls it after parsing
        the reply; a request without a session (no hint, no session key) keeps nothing."""
        self.scheduler.pause(request, tuple(str(t) for t in tools))
        self._wake.set()

    # ---- introspection ----------------------------------------------------------------
    async def inspect_cache(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(cache)`` (read-only, quick) on the loop thread between two steps: the brain is
        single-threaded, so this is the safe way to look at it from outside."""
        return await self._on_loop(lambda deliver: self.scheduler.inspect(fn, deliver))

    async def flush_cache(self) -> Any:
        """Drop every cached prefix (both tiers; the brain's ``KVCache.flush``), between two steps.
        Refused with :class:`EngineBusy` while requests are running or waiting, as SGLang refuses:
        a flush never takes KV from under a request. Returns the brain's ``FlushResult``."""
        return await self._on_loop(self.scheduler.flush)

    async def _on_loop(self, command: Callable[[Callable[[bool, Any], None]], None]) -> Any:
        """Queue ``command(deliver)`` for the loop thread and await what it delivers."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not future.done():
                future.set_result(value) if ok else future.set_exception(value)

        self._ensure_started(lambda: command(lambda ok, value: loop.call_soon_threadsafe(settle, ok, value)))
        self._wake.set()
        return await future

    def stats(self) -> dict[str, Any]:
        return {**self.scheduler.snapshot, "requests_in_flight": self.scheduler.in_flight}

    def info(self) -> dict[str, Any]:
        cfg = self.config
        device = cfg.torch_device()
        return {
            "version": _version(),
            "backend": "local",
            "model": self.model_name,
            "policy": cfg.cache.policy,
            "prefetch": self.scheduler.tiers.worker is not None,  # what was built, not a second copy of its rule
            "tiers": {
                "device": {"tokens": cfg.cache.device_tokens, "device": str(device)},
                "host": {"tokens": cfg.cache.host_tokens, "device": "cpu", "pinned": self.scheduler.host_pool.pinned},
            },
            "max_batch": cfg.max_batch,
            "chunk_tokens": cfg.chunk_tokens,
            "dtype": str(cfg.torch_dtype()).removeprefix("torch."),
            # what _validate admits: a longer prompt (plus max_tokens) is refused, whatever the model's own limit
            "context_length": min(cfg.cache.device_tokens, self.model_config.max_position),
        }
