"""Per-request bookkeeping inside the engine loop: tokens, slots, progress, output text."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from backends.base import FinishReason, GenerateRequest, GenerateResult, StreamEvent, TokenLogprob
from backends.kvcache import UNHINTED, IntakeDecision, Reservation, salted_key
from backends.local.tokenizer import ChatTokenizer, IncrementalDecoder

__all__ = ["Phase", "RequestState", "Sink"]

Sink = Callable[[StreamEvent | BaseException], None]
"""Delivers one event (or the error that ends the request) to the waiting caller; thread-safe."""


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(eq=False)
class RequestState:
    """A request in flight. Position ``i`` of prompt+output lives in ``slots(i + 1)[i]``: the
    reused cached prefix's slots first, then the slots its reservation holds."""

    request: GenerateRequest
    sink: Sink
    tokenizer: ChatTokenizer
    generator: torch.Generator | None
    phase: Phase = Phase.WAITING
    intake: IntakeDecision = UNHINTED  # the brain's decision at arrival: its agent and fixed boundary
    reservation: Reservation | None = None  # its slots and prefix lock, held from admission to the end
    cached_tokens: int = 0  # prompt tokens reused from the cache
    computed: int = 0  # prompt positions whose KV is in the pool
    outputs: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    grammar: Any = None  # a backends.local.grammar.TokenGrammar for a constrained request
    passed_over: int = 0  # times a returning continuation was admitted ahead of it (bounded)

    def __post_init__(self) -> None:
        self._decoder = IncrementalDecoder(self.tokenizer)
        self._holdback = max((len(s) for s in self.request.sampling.stop), default=1) - 1

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.input_ids

    def cache_key(self, tokens: tuple[int, ...]) -> tuple[int, ...]:
        """What the brain files ``tokens`` (a prefix of prompt + outputs) under: salted by the
        request's ``cache_salt``, so requests with different salts share no cached KV."""
        return salted_key(tokens, self.request.cache_salt)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def slots(self, end: int) -> list[int]:
        """Slots of positions ``[0, end)`` (none before admission)."""
        return list(self.reservation.slots(end)) if self.reservation is not None else []

    def push_token(self, token: int) -> FinishReason | None:
        """Record a sampled token; returns why the request ends now, if it does."""
        sampling = self.request.sampling
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.outputs.append(token)
        if token in self.tokenizer.eos_token_ids and not sampling.ignore_eos:
            return "stop"
        searched = len(self.text)
        self.text += self._decoder.push(token)
        for stop in sampling.stop:
            # only a match that ends in the new text is new: do not rescan the whole output every token
            cut = self.text.find(stop, max(0, searched - len(stop) + 1) if stop else 0)
            if cut >= 0:
                self.text = self.text[:cut]
                return "stop"
        if len(self.outputs) >= sampling.max_tokens:
            return "length"
        return None

    def take_delta(self, final: bool) -> str:
        """Text not streamed yet; while running, hold back what could be the start of a stop string."""
        end = len(self.text) if final else max(self.emitted_chars, len(self.text) - self._holdback)
        delta, self.emitted_chars = self.text[self.emitted_chars:end], end
        return delta

    def result(self, reason: FinishReason) -> GenerateResult:
        now = time.perf_counter()
        return GenerateResult(
            request_id=self.request_id,
            output_ids=tuple(self.outputs),
            text=self.text,
            finish_reason=reason,
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached_tokens,
            ttft_s=(self.first_token_at or now) - self.submitted_at,
            total_s=now - self.submitted_at,
            logprobs=tuple(self.logprobs) if self.request.sampling.logprobs is not None else None,
        )
