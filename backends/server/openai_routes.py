"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``.

Chat messages are encoded with the engine's chat template; the hint's ``fixed_prefix`` counts leading
messages (the agent's fixed prompt). For ``/v1/completions`` it counts characters of a text prompt,
or tokens of a token-id prompt.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Iterable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from backends.base import EncodedPrompt, GenerateRequest, StreamEvent
from backends.server import openai_models as api
from backends.server import tool_calls
from backends.server.errors import APIError
from backends.server.learning import learned_hint, learned_reply
from backends.server.serving import (ServerContext, checked_encoding, complete_all, open_stream, parse_json_body,
                                     read_hint, sse_response)
from kvflow_orch.protocol import KVFlowHint

__all__ = ["openai_router", "served_model", "engine_request", "encode_conversation", "keep_if_paused", "called_tools",
           "CHAT_DEFAULT_MAX_TOKENS"]

CHAT_DEFAULT_MAX_TOKENS = 256
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def served_model(ctx: ServerContext, name: str | None) -> str:
    """The engine's model name; a 404 naming what is served for a ``model`` this server does not serve."""
    if name is not None and name not in ctx.model_names:
        served = ", ".join(sorted(ctx.model_names))
        raise APIError(404, f"model {name!r} is not served here; available: {served}", code="model_not_found",
                       param="model")
    return ctx.engine.model_name


def engine_request(ctx: ServerContext, body: api.SamplingFields, encoded: EncodedPrompt, hint: KVFlowHint | None,
                   default_max_tokens: int, field: str) -> GenerateRequest:
    temperature, top_p = body.decoding()
    sampling = ctx.sampling(
        max_tokens=body.requested_max_tokens(), default_max_tokens=default_max_tokens, field=field,
        temperature=temperature, top_p=top_p, seed=body.seed, stop=body.stop,
        ignore_eos=body.ignore_eos, **body.sampling_options(),
    )
    return GenerateRequest(input_ids=encoded.input_ids, sampling=sampling, hint=hint,
                           fixed_prefix_tokens=encoded.fixed_prefix_tokens, cache_salt=body.cache_salt,
                           session=body.session_key())


def keep_if_paused(ctx: ServerContext, greq: GenerateRequest, tools: list[str]) -> None:
    """A reply that calls ``tools`` pauses its agent: the engine keeps the conversation for the
    return (engines without continuations have no ``pause``)."""
    pause = getattr(ctx.engine, "pause", None)
    if tools and pause is not None:
        pause(greq, tools)


def called_tools(message: dict[str, Any]) -> list[str]:
    """The names of the tools a chat reply's message calls."""
    return [call["function"]["name"] for call in message.get("tool_calls") or ()]


def encode_conversation(ctx: ServerContext, history: list[api.ChatMessage], hint: KVFlowHint | None,
                        plan: tool_calls.ChatPlan, field: str) -> EncodedPrompt:
    """``history`` through the chat template, the hint's ``fixed_prefix`` (leading messages) marking
    the agent's fixed part; ``field`` is the conversation's request field, named by its errors."""
    if len(history) > ctx.limits.max_messages:
        raise APIError(400, f"{field}: {len(history)} messages; the limit is {ctx.limits.max_messages}",
                       code="invalid_value", param=field)
    fixed = hint.fixed_prefix if hint is not None else None
    if fixed is not None and fixed > len(history):
        raise APIError(400, f"custom_params.kvflow.fixed_prefix: {fixed} exceeds the {len(history)} "
                       "messages sent", code="invalid_hint", param="custom_params.kvflow.fixed_prefix")
    messages, fixed = tool_calls.render_messages(history, plan, fixed)
    return checked_encoding(lambda: ctx.engine.tokenizer.encode_chat(messages, fixed_messages=fixed))


def _render_calls(id_: str, model: str, calls: tool_calls.ToolCallStream, event: StreamEvent,
                  usage_chunk: bool, fixed_tokens: int | None) -> Iterable[dict[str, Any]]:
    """Chunks of a tool-envelope reply: tool-call (or content) deltas, then the finish reason."""
    for delta in calls.feed(event.text_delta) if event.text_delta else ():
        yield api.chat_chunk(id_, model, delta)
    if event.result is not None:
        deltas, reason = calls.finish(event.result.text, event.result.finish_reason)
        for delta in deltas:
            yield api.chat_chunk(id_, model, delta)
        yield api.chat_chunk(id_, model, {}, reason)
        if usage_chunk:
            yield api.usage_chunk(id_, "chat.completion.chunk", model, event.result, fixed_tokens)


def _choices(ctx: ServerContext, route: str, body: api.SamplingFields, greq: GenerateRequest) -> list[GenerateRequest]:
    """One engine request per choice; with a seed, choice ``i`` samples with ``seed + i``."""
    if body.n > 1 and body.stream:
        raise APIError(400, "n > 1 is not supported with stream: true; send n requests or drop stream",
                       code="unsupported_value", param="n")
    greqs = [greq]
    for i in range(1, body.n):
        seed = greq.sampling.seed
        if seed is not None:
            seed = (seed + i - api.SEED_MIN) % 2**64 + api.SEED_MIN
        sampling = dataclasses.replace(greq.sampling, seed=seed)
        greqs.append(dataclasses.replace(greq, sampling=sampling, request_id=uuid.uuid4().hex))
    return [ctx.submit(route, g) for g in greqs]


def openai_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    created = int(time.time())

    @router.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models() -> dict[str, Any]:
        return api.model_list(ctx.engine.model_name, created, ctx.engine.info().get("context_length"))

    @router.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    async def model(model_id: str) -> dict[str, Any]:
        served_model(ctx, model_id)
        return api.model_card(model_id, created, ctx.engine.info().get("context_length"))

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body, raw = await parse_json_body(request, api.ChatCompletionRequest)
        model = served_model(ctx, body.model)
        hint = read_hint({"custom_params": body.custom_params})
        hint, learned = learned_hint(request, ctx, "chat", raw, hint)
        plan = tool_calls.plan_chat(body)
        encoded = encode_conversation(ctx, body.messages, hint, plan, "messages")
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        greq = engine_request(ctx, body, encoded, hint, CHAT_DEFAULT_MAX_TOKENS, field)
        greqs = _choices(ctx, "chat", body, dataclasses.replace(greq, constraint=plan.constraint))
        greq, decode, fixed_tokens = greqs[0], ctx.engine.tokenizer.decode, encoded.fixed_prefix_tokens
        id_ = api.completion_id("chatcmpl")
        if not body.stream:
            results = await complete_all(request, ctx, greqs, "messages", plan.constraint_param)
            reply = api.chat_completion(id_, model, results, decode, fixed_tokens)
            if plan.envelope:
                for choice, result in zip(reply["choices"], results, strict=True):
                    choice["message"], choice["finish_reason"] = tool_calls.parse_reply(result.text,
                                                                                        result.finish_reason)
            learned_reply(ctx, learned, reply["choices"][0]["message"])
            keep_if_paused(ctx, greq, called_tools(reply["choices"][0]["message"]))
            return JSONResponse(reply)
        role_sent = False
        calls = tool_calls.ToolCallStream() if plan.envelope else None

        def render(event: StreamEvent) -> Iterable[dict[str, Any]]:
            nonlocal role_sent
            if not role_sent:
                role_sent = True
                yield api.chat_chunk(id_, model, {"role": "assistant", "content": ""})
            if event.result is not None:
                result = event.result
                message = (tool_calls.parse_reply(result.text, result.finish_reason)[0]
                           if plan.envelope else {"content": result.text})
                learned_reply(ctx, learned, message)
                keep_if_paused(ctx, greq, called_tools(message))
            if calls is not None:
                yield from _render_calls(id_, model, calls, event, body.wants_usage_chunk(), fixed_tokens)
                return
            logprobs = api.chat_logprobs(decode, (event.logprob,)) if event.logprob is not None else None
            if event.text_delta or logprobs is not None:
                yield api.chat_chunk(id_, model, {"content": event.text_delta}, logprobs=logprobs)
            if event.result is not None:
                yield api.chat_chunk(id_, model, {}, event.result.finish_reason)
                if body.wants_usage_chunk():
                    yield api.usage_chunk(id_, "chat.completion.chunk", model, event.result, fixed_tokens)

        return sse_response(*await open_stream(request, ctx, greq, "messages", plan.constraint_param), render)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body, raw = await parse_json_body(request, api.CompletionRequest)
        model = served_model(ctx, body.model)
        hint = read_hint({"custom_params": body.custom_params})
        fixed = hint.fixed_prefix if hint is not None else None
        hint, learned = learned_hint(request, ctx, "completions", raw, hint)
        encoded = ctx.encode_prompt(body.prompt, fixed, "prompt")
        greq = engine_request(ctx, body, encoded, hint, COMPLETION_DEFAULT_MAX_TOKENS, "max_tokens")
        greqs = _choices(ctx, "completions", body, greq)
        greq, decode, fixed_tokens = greqs[0], ctx.engine.tokenizer.decode, encoded.fixed_prefix_tokens
        id_ = api.completion_id("cmpl")
        if not body.stream:
            results = await complete_all(request, ctx, greqs, "prompt")
            learned_reply(ctx, learned, {"content": results[0].text})
            return JSONResponse(api.text_completion(id_, model, results, decode, fixed_tokens))
        offset = 0

        def render(event: StreamEvent) -> Iterable[dict[str, Any]]:
            nonlocal offset
            logprobs = api.text_logprobs(decode, (event.logprob,), offset) if event.logprob is not None else None
            if event.text_delta or logprobs is not None:
                yield api.text_chunk(id_, model, event.text_delta, logprobs=logprobs)
                offset += len(event.text_delta)
            if event.result is not None:
                learned_reply(ctx, learned, {"content": event.result.text})
                yield api.text_chunk(id_, model, "", event.result.finish_reason)
                if body.wants_usage_chunk():
                    yield api.usage_chunk(id_, "text_completion", model, event.result, fixed_tokens)

        return sse_response(*await open_stream(request, ctx, greq, "prompt"), render)

    return router
