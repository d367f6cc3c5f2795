"""One small async interface over every kvflow backend the conformance suite runs: the in-process
Engine, and the same Engine behind the HTTP server. A behaviour test written against
:class:`Backend` runs unchanged on each."""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Protocol, Sequence

import httpx

from backends.base import GenerateRequest, SamplingParams, ServingEngine
from kvflow_orch.protocol import KVFlowHint, StepsUpdate, attach_hint

Messages = Sequence[dict[str, str]]


class Reply(NamedTuple):
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Backend(Protocol):
    name: str
    min_prefix_reuse: int  # cached tokens a repeated ~20-word system prompt must at least give

    async def chat(self, messages: Messages, *, max_tokens: int, hint: KVFlowHint | None = None,
                   stream: bool = False) -> Reply: ...

    async def apply_steps(self, update: StepsUpdate) -> None: ...

    async def stats(self) -> dict[str, Any]: ...


class InProcess:
    """The engine called directly, as the runtime's ``backend="local"`` does."""

    name = "in-process"
    min_prefix_reuse = 100

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine

    def _request(self, messages: Messages, max_tokens: int, hint: KVFlowHint | None) -> GenerateRequest:
        encoded = self.engine.tokenizer.encode_chat(list(messages), fixed_messages=hint.fixed_prefix if hint else None)
        return GenerateRequest(input_ids=encoded.input_ids, sampling=SamplingParams(max_tokens=max_tokens),
                               hint=hint, fixed_prefix_tokens=encoded.fixed_prefix_tokens)

    async def chat(self, messages: Messages, *, max_tokens: int, hint: KVFlowHint | None = None,
                   stream: bool = False) -> Reply:
        request = self._request(messages, max_tokens, hint)
        if not stream:
            result = await self.engine.generate(request)
            text = result.text
        else:
            parts, result = [], None
            async for event in self.engine.stream(request):
                parts.append(event.text_delta)
                result = event.result or result
            assert result is not None, "the stream ended without a result"
            text = "".join(parts)
        return Reply(text, result.prompt_tokens, len(result.output_ids), result.cached_tokens)

    async def apply_steps(self, update: StepsUpdate) -> None:
        self.engine.apply_steps(update)

    async def stats(self) -> dict[str, Any]:
        return self.engine.stats()


class OverHTTP:
    """The engine behind the embedded server, spoken to as any OpenAI-compatible client would."""

    def __init__(self, url: str, *, name: str = "http", min_prefix_reuse: int = 100) -> None:
        self.url = url
        self.name = name
        self.min_prefix_reuse = min_prefix_reuse

    async def chat(self, messages: Messages, *, max_tokens: int, hint: KVFlowHint | None = None,
                   stream: bool = False) -> Reply:
        body: dict[str, Any] = {"messages": list(messages), "max_tokens": max_tokens, "temperature": 0}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        if hint is not None:
            body = attach_hint(body, hint)
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        if stream:
            events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
            usage = chunks[-1]["usage"]
        else:
            data = r.json()
            text, usage = data["choices"][0]["message"]["content"], data["usage"]
        return Reply(text, usage["prompt_tokens"], usage["completion_tokens"],
                     usage["prompt_tokens_details"]["cached_tokens"])

    async def apply_steps(self, update: StepsUpdate) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            r = await client.post("/kvflow/v1/steps", json=update.model_dump(mode="json"))
        assert r.status_code == 200, r.text

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            return (await client.get("/kvflow/v1/stats")).json()
