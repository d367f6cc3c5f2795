"""The request of ``POST /v1/responses`` (OpenAI's Responses API), read into what the chat route
already serves: a conversation of :class:`~backends.server.openai_models.ChatMessage`, a tool plan
and sampling fields.

What is served: ``input`` as a string or a list of items (messages, with or without
``"type": "message"``; ``function_call`` and ``function_call_output`` items), ``instructions`` (the
first, system message), function ``tools`` with ``tool_choice``, ``text.format`` (``text``,
``json_object``, ``json_schema``), ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``,
``parallel_tool_calls`` (a reply holds at most one call, which either value allows), ``metadata``
(echoed). Responses are not stored (``store: false`` semantics): every field that needs a stored
response or a hosted feature (``store: true``, ``previous_response_id``, ``conversation``,
``background``, ``prompt``, item references, hosted tools, ``reasoning``, ``truncation: "auto"``,
``include`` entries other than ``reasoning.encrypted_content``) is a 400 naming it, never ignored.
The kvflow hint rides in ``custom_params.kvflow`` as on the chat route; its ``fixed_prefix``
counts leading messages of the conversation, ``instructions`` being the first.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from backends.server import openai_models as api
from backends.server import tool_calls

__all__ = ["ResponsesRequest", "conversation", "plan_response"]

_ITEM_TYPES = ("message", "function_call", "function_call_output")
_INCLUDABLE = frozenset({"reasoning.encrypted_content"})
"""``include`` entries that ask for nothing this server could leave out (it produces no reasoning items)."""


_UNSUPPORTED = {
    "previous_response_id": "responses are not stored here (store: false); send the whole conversation as input",
    "conversation": "conversations are not stored here; send the whole conversation as input",
    "background": "background responses need stored responses, which this server does not keep",
    "prompt": "stored prompt templates are not available here; send instructions and input",
    "reasoning": "this model does not reason (no reasoning items are produced)",
    "top_logprobs": "log-probabilities are served on /v1/chat/completions (logprobs, top_logprobs)",
    "store": "responses are not stored here; send store: false or leave it out",
}


class ContentPart(api.LenientModel):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str = ""
    refusal: str = ""


class MessageItem(api.LenientModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or part.refusal for part in self.content)


class FunctionCallItem(api.LenientModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(api.LenientModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(api.LenientModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(api.LenientModel):
    type: Literal["function"]
    name: str


class TextFormat(api.LenientModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(api.LenientModel):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None
    """``low``/``high`` ask a model to change its length: nothing here can honour that."""


class ResponsesRequest(api.SamplingFields):
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = Field(default=None, ge=1)
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = None
    # Fields that need stored responses or hosted features: refused by name (see _unsupported).
    previous_response_id: Any = None
    conversation: Any = None
    background: Any = None
    prompt: Any = None
    reasoning: Any = None
    top_logprobs: Any = None

    @field_validator(*_UNSUPPORTED)
    @classmethod
    def _unsupported(cls, value: Any, info: Any) -> Any:
        if value not in (None, False, 0, {}, []):
            raise ValueError(f"not supported: {_UNSUPPORTED[info.field_name]}")
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _typed_items(cls, items: Any) -> Any:
        return [_typed(item, i) for i, item in enumerate(items)] if isinstance(items, list) else items

    @field_validator("include")
    @classmethod
    def _include(cls, include: list[str] | None) -> list[str] | None:
        unknown = [entry for entry in include or () if entry not in _INCLUDABLE]
        if unknown:
            raise ValueError(f"{unknown[0]!r} cannot be included (supported: {', '.join(sorted(_INCLUDABLE))})")
        return include

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[InputItem]) -> str | list[InputItem]:
        if not value:
            raise ValueError("input must not be empty")
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_output_tokens if self.max_output_tokens is not None else self.max_tokens




def _typed(item: Any, index: int) -> Any:
    """An input item with its ``type`` (a bare ``{"role", "content"}`` is a message); a 400 naming
    the item for a type this server does not serve (reasoning, item references, hosted tools)."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in _ITEM_TYPES:
        raise ValueError(f"item {index} is of type {kind!r}, which is not supported "
                         f"(supported: {', '.join(_ITEM_TYPES)})")
    return {**item, "type": kind}


def conversation(body: ResponsesRequest) -> list[api.ChatMessage]:
    """``instructions`` and ``input`` as chat messages: a ``function_call`` item becomes an assistant
    message with that call, a ``function_call_output`` a ``tool`` message."""
    messages = [api.ChatMessage(role="system", content=body.instructions)] if body.instructions is not None else []
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for item in items:
        if isinstance(item, MessageItem):
            messages.append(api.ChatMessage(role=item.role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            function = api.ToolCallFunction(name=item.name, arguments=item.arguments)
            call = api.ToolCall(id=item.call_id, function=function)
            messages.append(api.ChatMessage(role="assistant", tool_calls=[call]))
        else:
            messages.append(api.ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
    return messages


def plan_response(body: ResponsesRequest) -> tool_calls.ChatPlan:
    """:func:`tool_calls.plan` for a Responses request (same envelope, same schema checks)."""
    tools = [tool_calls.ToolSpec(t.name, t.description, t.parameters, f"tools.{i}.parameters")
             for i, t in enumerate(body.tools or [])]
    choice, named = body.tool_choice, isinstance(body.tool_choice, NamedFunction)
    fmt = body.text.format if body.text is not None else None
    output = None if fmt is None else tool_calls.OutputFormat(fmt.type, fmt.schema_, "text.format.schema")
    return tool_calls.plan(tools, choice.name if named else choice, output, named=named)  # type: ignore[union-attr]
