"""How a route hands a request to the engine: body parsing, sampling limits, cancellation on
client disconnect, and Server-Sent Events.

Invariant: a request whose client goes away is cancelled in the engine (its KV slots come back),
whether the client leaves while waiting for a whole answer or in the middle of a stream; an engine
failure is always reported as the JSON error shape, in-band (``data: {"error": ...}``) once a stream
has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from backends.base import EncodedPrompt, GenerateRequest, GenerateResult, SamplingParams, ServingEngine, StreamEvent
from backends.learn import TrafficLearner
from backends.server.errors import APIError, ClientDisconnected, error_body, from_engine_error, from_validation_error
from backends.server.limits import ServerLimits
from kvflow_orch.protocol import HintError, KVFlowHint, extract_hint

__all__ = ["ServerContext", "parse_body", "parse_json_body", "validated_json", "read_hint", "checked_encoding",
           "until_disconnect", "complete", "complete_all", "open_stream", "sse_response", "SSEForm"]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
RequestObserver = Callable[[str, GenerateRequest], None]


@dataclass(frozen=True)
class ServerContext:
    """What every route needs: the engine, the limits and an optional observer of accepted requests
    (called with the route and the :class:`GenerateRequest` before it reaches the engine)."""

    engine: ServingEngine
    limits: ServerLimits
    model_names: frozenset[str]
    """Names a request's ``model`` field may use (the engine's own name plus any aliases)."""
    observer: RequestObserver | None = None
    learner: TrafficLearner | None = None
    """Learns hints for unhinted chat and completion requests (:mod:`backends.server.learning`)."""

    def sampling(
        self, *, max_tokens: int | None, default_max_tokens: int, field: str, temperature: float,
        top_p: float, seed: int | None, stop: str | list[str] | None, ignore_eos: bool, **options: Any,
    ) -> SamplingParams:
        """``stop`` as the wire sends it: one string, a list of them, or none (Sampling normalises it).
        ``options``: further :class:`SamplingParams` fields (penalties, top_k, logprobs...)."""
        tokens = default_max_tokens if max_tokens is None else max_tokens
        if tokens > self.limits.max_tokens:
            raise APIError(400, f"{field}: {tokens} exceeds the server limit of {self.limits.max_tokens}",
                           code="invalid_value", param=field)
        try:
            params = SamplingParams(max_tokens=tokens, temperature=temperature, top_p=top_p, seed=seed,
                                    stop=stop, ignore_eos=ignore_eos, **options)  # type: ignore[arg-type]
        except ValueError as exc:
            raise APIError(400, str(exc), code="invalid_value", param=str(exc).split(" ", 1)[0]) from None
        self.check_token_ids(tuple(token for token, _ in params.logit_bias), "logit_bias")
        if len(params.stop) > self.limits.max_stop:
            raise APIError(400, f"stop: {len(params.stop)} stop strings; the limit is {self.limits.max_stop}",
                           code="invalid_value", param="stop")
        return params

    def check_token_ids(self, ids: tuple[int, ...], field: str) -> None:
        vocab = getattr(self.engine.tokenizer, "vocab_size", None)
        if vocab is not None and ids and max(ids) >= vocab:
            raise APIError(400, f"{field}: token id {max(ids)} is outside the vocabulary (size {vocab})",
                           code="invalid_value", param=field)

    def encode_prompt(self, prompt: str | Sequence[int], fixed: int | None, field: str) -> EncodedPrompt:
        """A text prompt (``fixed`` counts characters) or token ids (``fixed`` counts tokens)."""
        if isinstance(prompt, str):
            return checked_encoding(lambda: self.engine.tokenizer.encode_text(prompt, fixed_chars=fixed))
        ids = tuple(prompt)
        self.check_token_ids(ids, field)
        return EncodedPrompt(ids, None if fixed is None else min(fixed, len(ids)))

    def submit(self, route: str, request: GenerateRequest) -> GenerateRequest:
        if self.observer is not None:
            self.observer(route, request)
        return request


async def parse_body(request: Request, model: type[M], *, status: int = 400) -> M:
    """Read and validate a JSON body: 400 for bytes that are not JSON, ``status`` naming the field
    for anything else (400, as OpenAI answers; kvflow's own steps route keeps the protocol's 422)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation_error(exc, status=status) from None


async def parse_json_body(request: Request, model: type[M]) -> tuple[M, dict[str, Any]]:
    """:func:`parse_body`'s answer (its errors alike) and the JSON object it validated, parsed once
    (:func:`validated_json`): the traffic learner reads what the model keeps none of (session keys
    in ``metadata``, the tools' schemas as sent)."""
    return validated_json(await request.body(), model)


def validated_json(raw: bytes, model: type[M]) -> tuple[M, dict[str, Any]]:
    """``raw`` validated into ``model``, and the JSON object it was. Parsing to Python and
    validating that costs less than validating the bytes (``benchmarks/learner_cost.py`` prints
    both); the models are strict and take JSON's types only, so both readings accept the same
    bodies, and a refused body is validated again as bytes so that its error names the fault in
    the words every route uses."""
    try:
        data = from_json(raw, cache_strings=False)
    except ValueError:
        data = None
    if isinstance(data, dict):
        with contextlib.suppress(ValidationError):
            return model.model_validate(data), data
    try:
        validated = model.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    return validated, data if isinstance(data, dict) else {}


def read_hint(body: Mapping[str, Any], *, route: str = "openai") -> KVFlowHint | None:
    """The request's kvflow hint (``None`` without one); a malformed hint is a 400 naming the field."""
    try:
        return extract_hint(body, route=route)
    except HintError as exc:
        error = from_engine_error(exc)
        error.param = "sampling_params.custom_params.kvflow" if route == "generate" else error.param
        raise error from None


def checked_encoding(encode: Callable[[], EncodedPrompt]) -> EncodedPrompt:
    """Run the tokenizer: a prompt it refuses, or one that encodes to nothing, is a 400."""
    try:
        encoded = encode()
    except ValueError as exc:
        raise APIError(400, f"cannot encode the prompt: {exc}", code="invalid_prompt") from None
    if not encoded.input_ids:
        raise APIError(400, "the prompt encodes to zero tokens", code="invalid_prompt")
    return encoded


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` unless the client disconnects first; then cancel it (which cancels the
    engine request) and raise :class:`ClientDisconnected`."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
        # Wait for the engine to finish cancelling, so its slots are free when we answer.
        await asyncio.gather(work, gone, return_exceptions=True)
    if work.cancelled():
        raise ClientDisconnected()
    return work.result()


async def complete(request: Request, ctx: ServerContext, greq: GenerateRequest, prompt_field: str | None = None,
                   constraint_field: str | None = None) -> GenerateResult:
    """``prompt_field`` names the prompt's field in a context-length error, ``constraint_field`` the
    field of the request's constraint in a grammar error."""
    return (await complete_all(request, ctx, [greq], prompt_field, constraint_field))[0]


async def complete_all(request: Request, ctx: ServerContext, greqs: Sequence[GenerateRequest],
                       prompt_field: str | None = None, constraint_field: str | None = None) -> list[GenerateResult]:
    """:func:`complete` for several requests at once (the choices of ``n > 1``); one failing fails all."""
    if len(greqs) == 1:
        work = ctx.engine.generate(greqs[0])
    else:
        work = asyncio.gather(*(ctx.engine.generate(g) for g in greqs))
    try:
        result = await until_disconnect(request, work)
    except (ClientDisconnected, APIError):
        raise
    except Exception as exc:
        raise from_engine_error(exc, prompt_field=prompt_field, constraint_field=constraint_field) from None
    return [result] if len(greqs) == 1 else list(result)


async def _aclose(events: AsyncIterator[StreamEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        # Shielded: closing is what cancels the engine request, so it must run even while the
        # response task is being cancelled because the client left.
        with anyio.CancelScope(shield=True):
            await aclose()


async def open_stream(
    request: Request, ctx: ServerContext, greq: GenerateRequest, prompt_field: str | None = None,
    constraint_field: str | None = None,
) -> tuple[StreamEvent, AsyncIterator[StreamEvent]]:
    """Start a stream and wait for its first event, so that a request the engine refuses
    (too large, invalid) still gets a proper HTTP status instead of a 200 with an in-band error."""
    events = ctx.engine.stream(greq).__aiter__()
    try:
        first = await until_disconnect(request, events.__anext__())
    except BaseException as exc:
        await _aclose(events)
        if isinstance(exc, (ClientDisconnected, APIError)) or not isinstance(exc, Exception):
            raise
        if isinstance(exc, StopAsyncIteration):
            exc = RuntimeError("the engine ended the stream without a result")
        raise from_engine_error(exc, prompt_field=prompt_field, constraint_field=constraint_field) from None
    return first, events


def _data(payload: Any, named: bool) -> bytes:
    head = f"event: {payload['type']}\n".encode() if named and isinstance(payload, dict) and "type" in payload else b""
    return head + b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _error_payload(error: APIError) -> Any:
    return error_body(error.message, error.type, error.code, error.param)


async def _sse_body(
    first: StreamEvent, events: AsyncIterator[StreamEvent], render: Callable[[StreamEvent], Iterable[Any]],
    form: SSEForm,
) -> AsyncIterator[bytes]:
    try:
        for payload in render(first):
            yield _data(payload, form.named)
        if first.result is None:
            async for event in events:
                for payload in render(event):
                    yield _data(payload, form.named)
    except Exception as exc:
        error = exc if isinstance(exc, APIError) else from_engine_error(exc)
        yield _data(form.error(error), form.named)
    finally:
        await _aclose(events)
    if form.done:
        yield b"data: [DONE]\n\n"


@dataclass(frozen=True)
class SSEForm:
    """How a route's events are framed: ``named`` adds an ``event:`` line (the payload's ``type``),
    ``done`` ends with ``data: [DONE]`` (chat and completions), ``error`` renders an in-band error."""

    named: bool = False
    done: bool = True
    error: Callable[[APIError], Any] = _error_payload


def sse_response(
    first: StreamEvent, events: AsyncIterator[StreamEvent], render: Callable[[StreamEvent], Iterable[Any]],
    form: SSEForm = SSEForm(),
) -> StreamingResponse:
    """``text/event-stream`` of ``render(event)`` payloads, framed as ``form`` says."""
    return StreamingResponse(
        _sse_body(first, events, render, form),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
