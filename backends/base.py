"""The contract between a serving engine and whatever fronts it (HTTP server, in-process runtime).

The embedded torch engine (``backends.local``) implements :class:`ServingEngine`; the HTTP server
(``backends.server``) and the runtime's ``backend="local"`` only ever talk to this interface.

Invariants every implementation keeps:

* Greedy decoding (``temperature == 0``) is deterministic and independent of cache state: the same
  request yields the same ``output_ids`` whether its prefix was computed, hit, reloaded or prefetched.
* Every KV slot a request takes is returned when it ends — finished, failed, or cancelled (the
  caller cancelling the awaiting task or closing the stream iterator cancels the request).
* ``apply_steps``/hints never block on model work.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Protocol, Sequence, runtime_checkable

from kvflow_orch.protocol import Sampling as SamplingParams
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

__all__ = [
    "SamplingParams",
    "EncodedPrompt",
    "Constraint",
    "GenerateRequest",
    "GenerateResult",
    "TokenLogprob",
    "StreamEvent",
    "PromptTokenizer",
    "ServingEngine",
    "EngineError",
    "RequestTooLarge",
    "EngineBusy",
    "ConstraintError",
]

FinishReason = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """A request the engine cannot serve; the message says why (maps to HTTP 4xx at the server)."""


class RequestTooLarge(EngineError):
    """The prompt (plus ``max_tokens``) cannot fit in the device KV pool."""


class EngineBusy(EngineError):
    """An operation that needs an idle engine (flushing its cache) met running requests."""


class ConstraintError(EngineError):
    """A request's :class:`Constraint` cannot be compiled, or accepts nothing (a 400 naming its field)."""


@dataclass(frozen=True)
class EncodedPrompt:
    """Token ids of a prompt and where its fixed (agent) part ends, in tokens (``None``: unknown)."""

    input_ids: tuple[int, ...]
    fixed_prefix_tokens: int | None = None


ConstraintKind = Literal["json_schema", "json_object", "regex", "ebnf"]


@dataclass(frozen=True)
class Constraint:
    """What the output must match, enforced token by token (constrained decoding).

    ``spec`` is a JSON schema as JSON text (``json_schema``), a regular expression (``regex``) or an
    EBNF grammar in SGLang's (xgrammar's) dialect (``ebnf``); empty for ``json_object`` (any JSON
    object). An engine that accepts a constrained request returns output the constraint accepts in
    full (``finish_reason`` ``stop``), or, when ``max_tokens`` runs out first, a prefix of such output
    (``length``), as OpenAI truncates; a constraint it cannot compile, or that accepts nothing, is a
    :class:`ConstraintError`.
    """

    kind: ConstraintKind
    spec: str = ""


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    hint: KVFlowHint | None = None
    fixed_prefix_tokens: int | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    constraint: Constraint | None = None
    cache_salt: str | None = None
    """Requests with different salts (or one salted, one not) never share cached KV."""
    session: str | None = None
    """An explicit session key (OpenAI's ``prompt_cache_key`` / ``user``): what ties an unhinted
    request's return from a tool call to the conversation kept for it."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives at its position
    (``(token id, logprob)`` pairs, most likely first), in the model's own distribution."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    output_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens not recomputed: device hits + host reloads + prefetched."""
    ttft_s: float
    total_s: float
    logprobs: tuple[TokenLogprob, ...] | None = None
    """One entry per output token when ``sampling.logprobs`` was set."""


@dataclass(frozen=True)
class StreamEvent:
    token_id: int | None
    text_delta: str
    result: GenerateResult | None = None
    """Set on the last event only."""
    logprob: TokenLogprob | None = None
    """``token_id``'s log-probability when ``sampling.logprobs`` was set."""


@runtime_checkable
class PromptTokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_chat(self, messages: Sequence[dict[str, Any]], fixed_messages: int | None = None) -> EncodedPrompt:
        """Apply the chat template (with the generation prompt); the fixed prefix ends after the
        first ``fixed_messages`` messages."""
        ...

    def encode_text(self, text: str, fixed_chars: int | None = None) -> EncodedPrompt: ...


@runtime_checkable
class ServingEngine(Protocol):
    model_name: str
    tokenizer: PromptTokenizer

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def stream(self, request: GenerateRequest) -> AsyncIterator[StreamEvent]: ...

    def apply_steps(self, update: StepsUpdate) -> None: ...

    def stats(self) -> dict[str, Any]:
        """The cache brain's monotonic counters plus pool occupancy (device/host used/total)."""
        ...

    def info(self) -> dict[str, Any]:
        """Version, model, policy, tiers and capacities."""
        ...
