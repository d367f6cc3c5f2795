"""Request and response models of the OpenAI-compatible routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``).

Requests are parsed strictly (a string where a number belongs is a 400 naming the field); ``null``
for an optional field means its default, as on OpenAI; NaN and infinities are refused by name.
Fields OpenAI clients send that the engine has no use for are ignored, but non-text content parts
are rejected rather than silently dropped. Every sampling option a request may carry is implemented:
``logprobs``/``top_logprobs``, ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``,
``logit_bias``, ``top_k``, ``min_p`` and ``n`` (one engine request per choice). The kvflow hint rides in the top-level
``custom_params.kvflow`` (see :mod:`kvflow_orch.protocol`).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from backends.base import GenerateResult, TokenLogprob
from kvflow_orch.protocol import MAX_CACHE_SALT_LEN, MAX_NAME_LEN, check_cache_salt

__all__ = [
    "LenientModel",
    "ChatMessage",
    "ChatCompletionRequest",
    "Tool",
    "NamedToolChoice",
    "ResponseFormat",
    "CompletionRequest",
    "StreamOptions",
    "SamplingFields",
    "completion_id",
    "usage",
    "chat_completion",
    "chat_chunk",
    "text_completion",
    "text_chunk",
    "usage_chunk",
    "model_list",
    "model_card",
    "MAX_N",
    "MAX_TOP_LOGPROBS",
]

MAX_N = 16
MAX_TOP_LOGPROBS = 20
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # OpenAI's seed is a signed 64-bit integer


class LenientModel(BaseModel):
    """Ignores unknown fields (OpenAI clients send many), validates known ones strictly; ``null``
    for a field that has a default means that default (OpenAI's reading of ``"temperature": null``)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        nulls = {key for key, value in data.items() if value is None}
        if not nulls:
            return data
        defaulted = {f.alias or name for name, f in cls.model_fields.items()
                     if not f.is_required() and f.default is not None}
        return {key: value for key, value in data.items() if key not in nulls & defaulted}


class TextPart(LenientModel):
    type: Literal["text"]
    text: str


class ToolCallFunction(LenientModel):
    name: str
    arguments: str


class ToolCall(LenientModel):
    """A call in an assistant message of the history (``function.arguments`` is JSON text)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(LenientModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    """``function``: the legacy form of a tool result (``name`` + ``content``), read as ``tool``."""
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: ToolCallFunction | None = None
    """The legacy form of an assistant's single call, read as one entry of ``tool_calls``."""
    tool_call_id: str | None = None
    name: str | None = None

    def calls(self) -> list[ToolCall]:
        legacy = [ToolCall(function=self.function_call)] if self.function_call is not None else []
        return [*(self.tool_calls or []), *legacy]

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


CacheSalt = Annotated[str | None, Field(min_length=1, max_length=MAX_CACHE_SALT_LEN), AfterValidator(check_cache_salt)]
"""A request's ``cache_salt`` (top level on every generation route), checked by the protocol's rule."""


class StreamOptions(LenientModel):
    include_usage: bool = False


class SamplingFields(LenientModel):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    """0 keeps only the most likely token: greedy, as OpenAI reads it (vLLM refuses 0)."""
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    """Empty strings are refused, as vLLM refuses them (one would end every reply at once)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    ignore_eos: bool = False
    custom_params: dict[str, Any] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = None
    top_k: int = Field(default=0, ge=-1)
    """0 or -1: no limit (vLLM and SGLang use -1)."""
    user: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LEN)
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LEN)
    """OpenAI's session fields: either ties a plain agent's calls into one session (its conversation
    is kept across a tool pause, :mod:`backends.kvcache.continuations`)."""
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    cache_salt: CacheSalt = None
    """vLLM's field: requests with different salts never share cached KV (nor reveal, through
    ``cached_tokens``, what another client sent)."""

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise ValueError("stop strings must not be empty")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys are token ids; {key!r} is not one")
            if not -100 <= value <= 100:
                raise ValueError(f"bias of token {key} is {value}; it must be in [-100, 100]")
        return bias

    def top_logprobs_wanted(self) -> int | None:
        """How many alternatives per token the client asked for (``None``: no logprobs)."""
        return None

    def sampling_options(self) -> dict[str, Any]:
        """The options beyond max_tokens/temperature/top_p/seed/stop, as ``SamplingParams`` fields."""
        return {
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "top_k": max(self.top_k, 0), "min_p": self.min_p,
            "logit_bias": tuple((int(k), v) for k, v in (self.logit_bias or {}).items()),
            "logprobs": self.top_logprobs_wanted(),
        }

    def session_key(self) -> str | None:
        """The request's explicit session (``prompt_cache_key``, else ``user``): what ties an
        unhinted agent's return from a tool call to its kept conversation."""
        return self.prompt_cache_key if self.prompt_cache_key is not None else self.user

    def decoding(self) -> tuple[float, float]:
        """``(temperature, top_p)`` as the engine takes them: ``top_p`` 0 is greedy decoding."""
        return (0.0, 1.0) if self.top_p == 0 else (self.temperature, self.top_p)

    def wants_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class FunctionDef(LenientModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(LenientModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(LenientModel):
    name: str


class NamedToolChoice(LenientModel):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(LenientModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(LenientModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    functions: Any = None
    function_call: Any = None

    @field_validator("functions", "function_call")
    @classmethod
    def _no_legacy_functions(cls, value: Any, info: Any) -> Any:
        if value is not None:
            raise ValueError(f"the legacy {info.field_name} field is not supported; send tools and tool_choice "
                             "(role 'function' messages in the history are accepted)")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, top: int | None, info: Any) -> int | None:
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return top

    def top_logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] = Field(min_length=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Completions' form: the number of alternatives per token (0: the chosen token only)."""

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            prompt = prompt[0]
        if isinstance(prompt, list) and any(t < 0 for t in prompt):
            raise ValueError("token ids must be >= 0")
        return prompt

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported")
        return echo


# ----------------------------------------------------------------------------- responses


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(result: GenerateResult, *more: GenerateResult, fixed_prefix_tokens: int | None = None) -> dict[str, Any]:
    """``more``: the other choices of an ``n > 1`` request (same prompt, counted once).
    ``fixed_prefix_tokens``: the agent's fixed-prefix length the cache used (``None``: no boundary)."""
    completion = sum(len(r.output_ids) for r in (result, *more))
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in (result, *more))},
        "fixed_prefix_tokens": fixed_prefix_tokens,
    }


def _token_text(decode: Any, token: int) -> str:
    return str(decode([token]))


def chat_logprobs(decode: Any, entries: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """OpenAI's chat ``logprobs`` object (``{"content": [...]}``); ``decode(ids) -> str``."""
    if entries is None:
        return None

    def item(token: int, logprob: float) -> dict[str, Any]:
        text = _token_text(decode, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries], "refusal": None}


def text_logprobs(decode: Any, entries: tuple[TokenLogprob, ...] | None, offset: int = 0) -> dict[str, Any] | None:
    """OpenAI's legacy completions ``logprobs`` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    if entries is None:
        return None
    tokens = [_token_text(decode, e.token_id) for e in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_token_text(decode, t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


def _envelope(id_: str, object_: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id_, "object": object_, "created": int(time.time()), "model": model, "choices": choices}


def chat_completion(id_: str, model: str, results: list[GenerateResult], decode: Any,
                    fixed_prefix_tokens: int | None = None) -> dict[str, Any]:
    choices = [{
        "index": i,
        "message": {"role": "assistant", "content": result.text},
        "finish_reason": result.finish_reason,
        "logprobs": chat_logprobs(decode, result.logprobs),
    } for i, result in enumerate(results)]
    return {**_envelope(id_, "chat.completion", model, choices),
            "usage": usage(*results, fixed_prefix_tokens=fixed_prefix_tokens)}


def chat_chunk(id_: str, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
    return _envelope(id_, "chat.completion.chunk", model, [choice])


def text_completion(id_: str, model: str, results: list[GenerateResult], decode: Any,
                    fixed_prefix_tokens: int | None = None) -> dict[str, Any]:
    choices = [{"index": i, "text": result.text, "finish_reason": result.finish_reason,
                "logprobs": text_logprobs(decode, result.logprobs)} for i, result in enumerate(results)]
    return {**_envelope(id_, "text_completion", model, choices),
            "usage": usage(*results, fixed_prefix_tokens=fixed_prefix_tokens)}


def text_chunk(id_: str, model: str, text: str, finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
    return _envelope(id_, "text_completion", model, [choice])


def usage_chunk(id_: str, object_: str, model: str, result: GenerateResult,
                fixed_prefix_tokens: int | None = None) -> dict[str, Any]:
    return {**_envelope(id_, object_, model, []), "usage": usage(result, fixed_prefix_tokens=fixed_prefix_tokens)}


def model_card(model: str, created: int, max_model_len: int | None) -> dict[str, Any]:
    """``max_model_len`` (vLLM's name): the longest prompt plus reply the server admits."""
    return {"id": model, "object": "model", "created": created, "owned_by": "kvflow", "max_model_len": max_model_len}


def model_list(model: str, created: int, max_model_len: int | None) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(model, created, max_model_len)]}
