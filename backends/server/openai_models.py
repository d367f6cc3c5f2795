"""Request and response models of the OpenAI-compatible routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``).

Requests are parsed strictly (a string where a number belongs is a 422 naming the field); fields
OpenAI clients send that the engine has no use for are ignored, but ``n > 1`` and non-text content
parts are rejected rather than silently dropped. The kvflow hint rides in the top-level
``custom_params.kvflow`` (see :mod:`kvflow_orch.protocol`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backends.base import GenerateResult

__all__ = [
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
]


class _Lenient(BaseModel):
    """Ignores unknown fields (OpenAI clients send many), validates known ones strictly."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ToolCallFunction(_Lenient):
    name: str
    arguments: str


class ToolCall(_Lenient):
    """A call in an assistant message of the history (``function.arguments`` is JSON text)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class SamplingFields(_Lenient):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False
    custom_params: dict[str, Any] | None = None

    @field_validator("n")
    @classmethod
    def _single_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    def wants_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(_Lenient):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] = Field(min_length=1)
    echo: bool = False

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


def usage(result: GenerateResult) -> dict[str, Any]:
    completion = len(result.output_ids)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def _envelope(id_: str, object_: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id_, "object": object_, "created": int(time.time()), "model": model, "choices": choices}


def chat_completion(id_: str, model: str, result: GenerateResult) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "finish_reason": result.finish_reason,
        "logprobs": None,
    }
    return {**_envelope(id_, "chat.completion", model, [choice]), "usage": usage(result)}


def chat_chunk(id_: str, model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    return _envelope(id_, "chat.completion.chunk", model, [choice])


def text_completion(id_: str, model: str, result: GenerateResult) -> dict[str, Any]:
    choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason, "logprobs": None}
    return {**_envelope(id_, "text_completion", model, [choice]), "usage": usage(result)}


def text_chunk(id_: str, model: str, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return _envelope(id_, "text_completion", model, [choice])


def usage_chunk(id_: str, object_: str, model: str, result: GenerateResult) -> dict[str, Any]:
    return {**_envelope(id_, object_, model, []), "usage": usage(result)}


def model_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "kvflow"}]}
