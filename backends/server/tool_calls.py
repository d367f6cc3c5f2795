"""Tools and structured output on ``/v1/chat/completions``, for models without a tool-call template.

The embedded engine has no model-specific tool format, so tools work the same way for every model,
by constrained decoding (:class:`~backends.base.Constraint`):

* The tools are described to the model in one system message appended after the conversation (after
  the hint's fixed prefix, so cache hits are unchanged).
* The reply is a JSON *envelope* the grammar enforces: ``{"name": <tool>, "arguments": {...}}`` (a
  call; ``arguments`` valid against the tool's ``parameters``) or, with ``tool_choice="auto"`` only,
  ``{"content": "<text>"}`` (a plain answer). ``"required"`` allows any tool, a named choice that tool
  only, ``"none"`` no call and no envelope (the tools are not shown). One call per reply at most.
* Calls in the history (assistant ``tool_calls``) are shown to the model as the envelope it would have
  written; ``tool`` messages as their content.

The reply is then given back in OpenAI's shape: ``tool_calls`` with ids, ``function.arguments`` as
JSON text, ``finish_reason: "tool_calls"``; in a stream the call's name first, then its arguments as
they are generated. ``response_format`` (``json_object``, ``json_schema``) constrains the content
itself; it cannot be combined with tools that may be called.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from backends.base import Constraint
from backends.server import openai_models as api
from backends.server.errors import APIError

__all__ = ["ChatPlan", "plan_chat", "render_messages", "parse_reply", "ToolCallStream"]

_CALL_HEAD = re.compile(r'^\{"name":("(?:[^"\\]|\\.)*"),"arguments":')


@dataclass(frozen=True)
class ChatPlan:
    """How a chat request is decoded: its constraint, and whether the reply is a tool envelope."""

    constraint: Constraint | None = None
    tools_prompt: str | None = None
    """A system message to append after the conversation (tools described to the model)."""
    envelope: bool = False


def _call_schema(tool: api.Tool) -> dict[str, Any]:
    params = tool.function.parameters or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": tool.function.name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def _response_constraint(fmt: api.ResponseFormat | None) -> Constraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema" and fmt.json_schema is not None and fmt.json_schema.schema_ is not None:
        return Constraint("json_schema", json.dumps(fmt.json_schema.schema_))
    if fmt.type == "json_schema" and fmt.json_schema is None:
        raise APIError(400, "response_format.json_schema is required when type is 'json_schema'",
                       code="invalid_value")
    return Constraint("json_object")


def plan_chat(body: api.ChatCompletionRequest) -> ChatPlan:
    """The decoding plan of ``body``; a 400 naming the field for choices that contradict each other."""
    tools, choice = body.tools or [], body.tool_choice
    names = [t.function.name for t in tools]
    if choice is not None and choice != "none" and not tools:
        raise APIError(400, "tool_choice: set without tools", code="invalid_value")
    if len(set(names)) != len(names):
        raise APIError(400, "tools: function names must be unique", code="invalid_value")
    if isinstance(choice, api.NamedToolChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice: no tool named {choice.function.name!r} among the tools sent",
                       code="invalid_value")
    mode = "none" if not tools else ("auto" if choice is None else choice)
    if mode == "none":
        return ChatPlan(_response_constraint(body.response_format))
    if body.response_format is not None and body.response_format.type != "text":
        raise APIError(400, "response_format: cannot be combined with tools unless tool_choice is 'none'",
                       code="invalid_value")
    if isinstance(mode, api.NamedToolChoice):
        callable_ = [t for t in tools if t.function.name == mode.function.name]
    else:
        callable_ = tools
    options = [_call_schema(t) for t in callable_]
    if mode == "auto":
        options.insert(0, {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"],
                           "additionalProperties": False})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return ChatPlan(Constraint("json_schema", json.dumps(schema)), _tools_prompt(callable_, mode == "auto"), True)


def _tools_prompt(tools: list[api.Tool], may_answer: bool) -> str:
    described = [{"name": t.function.name, "description": t.function.description or "",
                  "parameters": t.function.parameters or {}} for t in tools]
    text = ("You can call these tools:\n" + json.dumps(described) + "\nTo call one, reply with only "
            '{"name": <tool name>, "arguments": <its arguments>}.')
    if may_answer:
        text += ' To answer without a tool, reply with only {"content": <your answer>}.'
    return text


def render_messages(body: api.ChatCompletionRequest, plan: ChatPlan) -> list[dict[str, str]]:
    """``body.messages`` as plain ``{"role", "content"}`` dicts for the chat template."""
    messages = []
    for m in body.messages:
        content = m.text()
        if m.role == "assistant" and m.tool_calls:
            calls = [_history_call(c) for c in m.tool_calls]
            content = "\n".join(filter(None, [content, *calls]))
        messages.append({"role": m.role, "content": content})
    if plan.tools_prompt is not None:
        messages.append({"role": "system", "content": plan.tools_prompt})
    return messages


def _history_call(call: api.ToolCall) -> str:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    return json.dumps({"name": call.function.name, "arguments": arguments}, separators=(",", ":"))


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_reply(text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
    """An envelope reply as an OpenAI message and its finish reason. A reply that is not a complete
    envelope (a stop string cut it, the request was aborted) is returned as text, unchanged."""
    try:
        obj = json.loads(text)
    except ValueError:
        return {"role": "assistant", "content": text}, finish_reason
    if isinstance(obj, dict) and "name" in obj and "arguments" in obj:
        head = _CALL_HEAD.match(text)
        # the arguments exactly as generated (what a stream sends), not re-serialized
        arguments = text[head.end():len(text) - 1] if head else json.dumps(obj["arguments"])
        call = {"id": _call_id(), "type": "function", "function": {"name": obj["name"], "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    if isinstance(obj, dict) and isinstance(obj.get("content"), str):
        return {"role": "assistant", "content": obj["content"]}, finish_reason
    return {"role": "assistant", "content": text}, finish_reason


class ToolCallStream:
    """Turns the text deltas of an envelope reply into OpenAI chat-chunk deltas: the call's id, type
    and name once the name is complete, then ``function.arguments`` pieces as they come (the
    envelope's closing brace held back); a ``{"content": ...}`` answer as one delta at the end."""

    def __init__(self) -> None:
        self._text = ""
        self._args_from: int | None = None
        self._sent = 0

    def feed(self, delta: str) -> list[dict[str, Any]]:
        self._text += delta
        out = []
        if self._args_from is None:
            head = _CALL_HEAD.match(self._text)
            if head is None:
                return out
            self._args_from = self._sent = head.end()
            out.append({"tool_calls": [{"index": 0, "id": _call_id(), "type": "function",
                                        "function": {"name": json.loads(head.group(1)), "arguments": ""}}]})
        end = len(self._text) - 1  # the last character may be the envelope's closing brace
        if end > self._sent:
            out.append(_args_delta(self._text[self._sent:end]))
            self._sent = end
        return out

    def finish(self, text: str, finish_reason: str) -> tuple[list[dict[str, Any]], str]:
        """The last deltas and the finish reason, given the reply's complete text."""
        message, reason = parse_reply(text, finish_reason)
        if self._args_from is None:
            content = message.get("content")
            if message.get("tool_calls"):  # the head never matched incrementally: send the call whole
                call = dict(message["tool_calls"][0], index=0)
                return [{"tool_calls": [call]}], reason
            return ([{"content": content}] if content else []), reason
        rest = text[self._sent:len(text) - 1] if reason == "tool_calls" else text[self._sent:]
        return ([_args_delta(rest)] if rest else []), reason


def _args_delta(piece: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
