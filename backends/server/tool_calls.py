"""Tools and structured output on ``/v1/chat/completions`` and ``/v1/responses``, for models without
a tool-call template.

The embedded engine has no model-specific tool format, so tools work the same way for every model,
by constrained decoding (:class:`~backends.base.Constraint`):

* The tools are described where they stay the same across an agent's calls: at the end of its system
  prompt (the first message, when it is a ``system`` or ``developer`` one), else in a system message
  of their own before the conversation. That is where tool-aware chat templates put them (Qwen2.5
  appends a ``# Tools`` block to the system message; Hermes opens with one), and what prefix caching
  needs: the tools are part of the agent's cached prefix, and of its fixed prefix (a declared
  ``fixed_prefix`` that covers the system prompt covers them; the learned rule sees them recur). The
  block lists every tool and both reply forms whatever ``tool_choice`` says, so an agent whose
  choice changes between calls (the Agents SDK resets ``required`` to ``auto`` after a call) keeps
  its prefix; what this one reply must be (``required``, a named tool) is said in a short system
  note after the conversation, where it leaves the prefix alone.
* The reply is a JSON *envelope* the grammar enforces: ``{"name": <tool>, "arguments": {...}}`` (a
  call; ``arguments`` valid against the tool's ``parameters``) or, with ``tool_choice="auto"`` only,
  ``{"content": "<text>"}`` (a plain answer). ``"required"`` allows any tool, a named choice that tool
  only, ``"none"`` no call and no envelope (the tools are not shown). One call per reply at most.
* Calls in the history (assistant ``tool_calls``, or a legacy ``function_call``) are shown to the
  model as the envelope it would have written; ``tool`` (and legacy ``function``) messages as their
  content.
* Each tool's ``parameters`` sit under the envelope's ``$defs``, their own local ``$ref`` pointers rewritten to
  point there (:func:`schemas.relocate`), and are checked by :func:`schemas.check_enforceable` first.

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
from typing import Any, Literal, NamedTuple

from backends.base import Constraint
from backends.server import openai_models as api
from backends.server import schemas
from backends.server.errors import APIError

__all__ = ["ChatPlan", "ToolSpec", "OutputFormat", "RenderedChat", "plan", "plan_chat", "render_messages",
           "parse_reply", "ToolCallStream"]

_SYSTEM_ROLES = ("system", "developer")
_CALL_HEAD = re.compile(r'^\{"name":("(?:[^"\\]|\\.)*"),"arguments":')


@dataclass(frozen=True)
class ChatPlan:
    """How a chat request is decoded: its constraint, and whether the reply is a tool envelope."""

    constraint: Constraint | None = None
    tools_prompt: str | None = None
    """The tools described to the model: the same text for every choice but ``none``; it goes at
    the end of the system prompt."""
    choice_note: str | None = None
    """What this reply must be (a call, of which tool), as a system note after the conversation."""
    envelope: bool = False
    constraint_param: str | None = None
    """The request field a grammar error is blamed on (the schema's field, or ``tools``)."""


@dataclass(frozen=True)
class ToolSpec:
    """A function tool as either API sends it; ``param`` is where its schema sits in the request."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None
    param: str


@dataclass(frozen=True)
class OutputFormat:
    """``response_format`` / ``text.format``: ``json_schema`` carries ``schema``, found at ``param``."""

    kind: str
    schema: dict[str, Any] | None
    param: str


ToolChoice = Literal["none", "auto", "required"] | str | None
"""``None`` (unset), a mode, or the name of the one function that must be called (``named``)."""


def _call_schema(tool: ToolSpec, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The envelope branch of one tool, and its parameters relocated under ``$defs`` (their own
    ``$ref`` pointers then resolve against the tool's schema, not the envelope's root)."""
    name = f"tool_{index}"
    params = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
    branch = {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": {"$ref": f"#/$defs/{name}"}},
              "required": ["name", "arguments"], "additionalProperties": False}
    return branch, {name: schemas.relocate(params, f"#/$defs/{name}")}


def _format_constraint(fmt: OutputFormat | None) -> Constraint | None:
    if fmt is None or fmt.kind == "text":
        return None
    if fmt.kind == "json_schema":
        if fmt.schema is None:
            raise APIError(400, f"{fmt.param}: a schema is required when the format is 'json_schema'",
                           code="invalid_value", param=fmt.param)
        schemas.check_enforceable(fmt.schema, fmt.param)
        return Constraint("json_schema", json.dumps(fmt.schema))
    return Constraint("json_object")


def plan(tools: list[ToolSpec], choice: ToolChoice, fmt: OutputFormat | None, *, named: bool = False,
         choice_param: str = "tool_choice") -> ChatPlan:
    """The decoding plan of a request; a 400 naming the field for choices that contradict each other
    and for schemas that cannot be enforced. ``named``: ``choice`` is a function name."""
    names = [t.name for t in tools]
    if choice is not None and choice != "none" and not tools:
        raise APIError(400, f"{choice_param}: set without tools", code="invalid_value", param=choice_param)
    if len(set(names)) != len(names):
        raise APIError(400, "tools: function names must be unique", code="invalid_value", param="tools")
    if named and choice not in names:
        raise APIError(400, f"{choice_param}: no tool named {choice!r} among the tools sent", code="invalid_value",
                       param=choice_param)
    mode = "none" if not tools else ("auto" if choice is None else choice)
    if mode == "none":
        return ChatPlan(_format_constraint(fmt), constraint_param=fmt.param if fmt is not None else None)
    if fmt is not None and fmt.kind != "text":
        raise APIError(400, f"{fmt.param.split('.')[0]}: cannot be combined with tools unless {choice_param} is 'none'",
                       code="invalid_value", param=fmt.param.split(".")[0])
    callable_ = [t for t in tools if t.name == mode] if named else tools
    for tool in callable_:
        if tool.parameters is not None:
            schemas.check_enforceable(tool.parameters, tool.param)
    options, defs = [], {}
    for i, tool in enumerate(callable_):
        branch, relocated = _call_schema(tool, i)
        options.append(branch)
        defs.update(relocated)
    if mode == "auto":
        options.insert(0, {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"],
                           "additionalProperties": False})
    schema = {**(options[0] if len(options) == 1 else {"anyOf": options}), "$defs": defs}
    return ChatPlan(Constraint("json_schema", json.dumps(schema)), _tools_prompt(tools), _choice_note(mode, named),
                    True, constraint_param="tools")


def plan_chat(body: api.ChatCompletionRequest) -> ChatPlan:
    """:func:`plan` for a chat completion request."""
    tools = [ToolSpec(t.function.name, t.function.description, t.function.parameters, f"tools.{i}.function.parameters")
             for i, t in enumerate(body.tools or [])]
    choice, named = body.tool_choice, isinstance(body.tool_choice, api.NamedToolChoice)
    fmt = body.response_format
    output = None if fmt is None else OutputFormat(
        fmt.type, fmt.json_schema.schema_ if fmt.json_schema is not None else None,
        "response_format.json_schema.schema" if fmt.json_schema is not None else "response_format.json_schema")
    return plan(tools, choice.function.name if named else choice, output, named=named)  # type: ignore[union-attr]


def _tools_prompt(tools: list[ToolSpec]) -> str:
    described = [{"name": t.name, "description": t.description or "", "parameters": t.parameters or {}} for t in tools]
    return ("You can call these tools:\n" + json.dumps(described) + "\nTo call one, reply with only "
            '{"name": <tool name>, "arguments": <its arguments>}. To answer without a tool, reply with only '
            '{"content": <your answer>}.')


def _choice_note(mode: str, named: bool) -> str | None:
    if named:
        return f"Call {mode} now."
    return "Call a tool now." if mode == "required" else None


class RenderedChat(NamedTuple):
    messages: list[dict[str, str]]
    """Plain ``{"role", "content"}`` dicts for the chat template."""
    fixed_messages: int | None
    """The declared fixed prefix counted in ``messages`` (a tools message of its own is inside it)."""


def render_messages(history: list[api.ChatMessage], plan: ChatPlan, fixed_messages: int | None = None) -> RenderedChat:
    """``history`` for the chat template, the tools after the system prompt; ``fixed_messages``
    (the hint's ``fixed_prefix``, counted in ``history``) mapped onto the rendered messages."""
    messages = []
    for m in history:
        content = m.text()
        if m.role == "assistant" and m.calls():
            calls = [_history_call(c) for c in m.calls()]
            content = "\n".join(filter(None, [content, *calls]))
        messages.append({"role": "tool" if m.role == "function" else m.role, "content": content})
    if plan.tools_prompt is not None:
        if messages and messages[0]["role"] in _SYSTEM_ROLES:
            system = messages[0]["content"]
            content = f"{system}\n\n{plan.tools_prompt}" if system else plan.tools_prompt
            messages[0] = {**messages[0], "content": content}
        else:
            messages.insert(0, {"role": "system", "content": plan.tools_prompt})
            fixed_messages = None if fixed_messages is None else fixed_messages + 1
    if plan.choice_note is not None:
        messages.append({"role": "system", "content": plan.choice_note})
    return RenderedChat(messages, fixed_messages)


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
