"""``POST /v1/responses``: OpenAI's Responses API over the same engine request the chat route makes.

A reply is one output item: a ``message`` with one ``output_text`` part, or a ``function_call``
(the tool envelope of :mod:`backends.server.tool_calls`, given back in the Responses shape). A
reply cut by ``max_output_tokens`` has ``status: "incomplete"`` and
``incomplete_details.reason: "max_output_tokens"``. With ``stream: true`` the events are the ones the
OpenAI SDK and the Agents SDK consume, each with a ``sequence_number`` and an ``event:`` line:
``response.created``, ``response.in_progress``, ``response.output_item.added``, then
``response.content_part.added`` / ``response.output_text.delta`` / ``.done`` /
``response.content_part.done`` for a message or ``response.function_call_arguments.delta`` /
``.done`` for a call, ``response.output_item.done``, and ``response.completed`` (or
``response.incomplete``) carrying the whole response; no ``[DONE]``. An engine failure once the
stream has started is an ``error`` event. See :mod:`backends.server.responses_models` for the fields.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from backends.base import GenerateResult, StreamEvent
from backends.server import responses_models as rm
from backends.server import tool_calls
from backends.server.errors import APIError, error_body
from backends.server.openai_routes import (CHAT_DEFAULT_MAX_TOKENS, encode_conversation, engine_request,
                                           keep_if_paused, served_model)
from backends.server.serving import SSEForm, ServerContext, complete, open_stream, parse_body, read_hint, sse_response

__all__ = ["responses_router", "RESPONSES_ROUTE"]

RESPONSES_ROUTE = "/v1/responses"


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(result: GenerateResult) -> dict[str, Any]:
    output = len(result.output_ids)
    return {"input_tokens": result.prompt_tokens, "input_tokens_details": {"cached_tokens": result.cached_tokens},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + output}


def _status(finish_reason: str) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return ("incomplete", None) if finish_reason == "abort" else ("completed", None)


class _Envelope:
    """The parts of a Response that do not depend on the reply (what the request asked for)."""

    def __init__(self, body: rm.ResponsesRequest, model: str, temperature: float, top_p: float) -> None:
        self.id = _id("resp")
        self.created = int(time.time())
        choice = body.tool_choice
        self.fields = {
            "object": "response", "model": model, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "parallel_tool_calls": body.parallel_tool_calls,
            "max_tool_calls": body.max_tool_calls, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": temperature,
            "top_p": top_p, "truncation": "disabled", "user": body.user, "metadata": body.metadata or {},
            "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)
                     if body.text is not None and body.text.format is not None else {"type": "text"}},
            "tool_choice": choice.model_dump() if isinstance(choice, rm.NamedFunction) else (choice or "auto"),
            "tools": [t.model_dump() for t in body.tools or []],
        }

    def response(self, status: str, output: list[dict[str, Any]], result: GenerateResult | None) -> dict[str, Any]:
        incomplete = _status(result.finish_reason)[1] if result is not None else None
        return {"id": self.id, "created_at": self.created, "status": status, "error": None,
                "incomplete_details": incomplete, "output": output, **self.fields,
                "usage": _usage(result) if result is not None else None}


def _message_item(text: str, status: str, id_: str | None = None) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": id_ or _id("msg"), "status": status, "role": "assistant", "content": content}


def _call_item(call_id: str, name: str, arguments: str, status: str, id_: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": id_ or _id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _output(result: GenerateResult, envelope: bool) -> tuple[list[dict[str, Any]], str]:
    """The output items of a finished reply and the Response's status."""
    status = _status(result.finish_reason)[0]
    if not envelope:
        return [_message_item(result.text, status)], status
    message, _ = tool_calls.parse_reply(result.text, result.finish_reason)
    calls = message.get("tool_calls") or []
    if calls:
        fn = calls[0]["function"]
        return [_call_item(calls[0]["id"], fn["name"], fn["arguments"], status)], status
    return [_message_item(message.get("content") or "", status)], status


class _EventStream:
    """Renders engine stream events as Responses stream events (one output item)."""

    def __init__(self, envelope: _Envelope, tool_envelope: bool) -> None:
        self._envelope = envelope
        self._calls = tool_calls.ToolCallStream() if tool_envelope else None
        self._seq = 0
        self._started = False
        self._item: dict[str, Any] | None = None  # the output item once announced
        self._text = ""

    def _event(self, type_: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": type_, "sequence_number": self._seq - 1, **fields}

    def error(self, error: APIError) -> dict[str, Any]:
        """The in-band ``error`` event (its ``error`` member makes the OpenAI SDK raise ``APIError``)."""
        return {**self._event("error", code=error.code, message=error.message, param=error.param),
                **error_body(error.message, error.type, error.code, error.param)}

    def render(self, event: StreamEvent) -> Iterator[dict[str, Any]]:
        if not self._started:
            self._started = True
            shell = self._envelope.response("in_progress", [], None)
            yield self._event("response.created", response=shell)
            yield self._event("response.in_progress", response=shell)
        deltas = [{"content": event.text_delta}] if self._calls is None and event.text_delta else \
            (self._calls.feed(event.text_delta) if self._calls is not None and event.text_delta else [])
        reason = None
        if event.result is not None:
            reason = event.result.finish_reason
            if self._calls is not None:
                more, reason = self._calls.finish(event.result.text, event.result.finish_reason)
                deltas += more
        for delta in deltas:
            yield from self._delta(delta)
        if event.result is not None:
            yield from self._finish(event.result, reason or event.result.finish_reason)

    def _delta(self, delta: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if "content" in delta:
            if self._item is None:
                self._item = _message_item("", "in_progress")
                yield self._event("response.output_item.added", output_index=0, item=self._item)
                yield self._event("response.content_part.added", item_id=self._item["id"], output_index=0,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": []})
            self._text += delta["content"] or ""
            yield self._event("response.output_text.delta", item_id=self._item["id"], output_index=0,
                              content_index=0, delta=delta["content"] or "", logprobs=[])
            return
        call = delta["tool_calls"][0]
        fn = call["function"]
        if self._item is None:
            self._item = _call_item(call["id"], fn["name"], "", "in_progress")
            yield self._event("response.output_item.added", output_index=0, item=self._item)
        if fn.get("arguments"):
            self._text += fn["arguments"]
            yield self._event("response.function_call_arguments.delta", item_id=self._item["id"], output_index=0,
                              delta=fn["arguments"])

    def _finish(self, result: GenerateResult, reason: str) -> Iterator[dict[str, Any]]:
        status = _status(result.finish_reason)[0]
        if self._item is None:  # nothing was generated: an empty message
            yield from self._delta({"content": ""})
        item = self._item
        assert item is not None
        if item["type"] == "message":
            part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
            yield self._event("response.output_text.done", item_id=item["id"], output_index=0, content_index=0,
                              text=self._text, logprobs=[])
            yield self._event("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
                              part=part)
            done = _message_item(self._text, status, item["id"])
        else:
            yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                              arguments=self._text, name=item["name"])
            done = _call_item(item["call_id"], item["name"], self._text, status, item["id"])
        yield self._event("response.output_item.done", output_index=0, item=done)
        final = "response.completed" if status == "completed" else "response.incomplete"
        yield self._event(final, response=self._envelope.response(status, [done], result))


def responses_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.post(RESPONSES_ROUTE)
    async def responses(request: Request) -> Response:
        body = await parse_body(request, rm.ResponsesRequest)
        model = served_model(ctx, body.model)
        if body.n != 1:
            raise APIError(400, "n: a response has one output; send n requests", code="unsupported_value", param="n")
        hint = read_hint({"custom_params": body.custom_params}, route="responses")
        plan = rm.plan_response(body)
        encoded = encode_conversation(ctx, rm.conversation(body), hint, plan, "input")
        field = "max_output_tokens" if body.max_output_tokens is not None else "max_tokens"
        greq = engine_request(ctx, body, encoded, hint, CHAT_DEFAULT_MAX_TOKENS, field)
        greq = ctx.submit("responses", dataclasses.replace(greq, constraint=plan.constraint))
        envelope = _Envelope(body, model, *body.decoding())
        if not body.stream:
            result = await complete(request, ctx, greq, "input", plan.constraint_param)
            output, status = _output(result, plan.envelope)
            keep_if_paused(ctx, greq, [item["name"] for item in output if item["type"] == "function_call"])
            return JSONResponse(envelope.response(status, output, result))
        events = _EventStream(envelope, plan.envelope)
        form = SSEForm(named=True, done=False, error=events.error)
        first, rest = await open_stream(request, ctx, greq, "input", plan.constraint_param)
        return sse_response(first, rest, events.render, form)

    return router

