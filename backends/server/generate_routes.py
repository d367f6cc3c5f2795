"""SGLang's native ``/generate`` route, in the request/response shape SGLang 0.5.23 uses.

As in SGLang, unknown top-level keys are ignored and unknown ``sampling_params`` keys are rejected.
``top_k``, ``min_p`` and the three penalties are implemented; SGLang sampling options the embedded
engine does not implement (``min_new_tokens``, ...) are accepted only at their neutral value, so a
client written for SGLang's defaults works and one that relies on them hears about it instead of
getting silently different sampling. SGLang's constrained decoding (``json_schema`` as JSON text,
``regex``, ``ebnf`` in xgrammar's dialect; at most one) is enforced. The hint rides in
``sampling_params.custom_params.kvflow``; its ``fixed_prefix`` counts characters of ``text`` or tokens
of ``input_ids``. Streams send cumulative ``text`` in every event, as SGLang does.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.base import Constraint, GenerateRequest, GenerateResult, StreamEvent
from backends.server import schemas
from backends.server.openai_models import CacheSalt
from backends.server.serving import ServerContext, complete, open_stream, parse_body, read_hint, sse_response

__all__ = ["GenerateBody", "SGLangSamplingParams", "generate_router", "meta_info"]

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default

# SGLang option -> the values that leave sampling unchanged (the only ones accepted here).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "min_new_tokens": (0,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "no_stop_trim": (False,),
}


class SGLangSamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    max_new_tokens: int = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=1)
    sampling_seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    custom_params: dict[str, Any] | None = None
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    min_new_tokens: int | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> SGLangSamplingParams:
        given = [name for name in ("json_schema", "regex", "ebnf") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"only one of json_schema, regex and ebnf may be set (got {', '.join(given)})")
        return self

    def constraint(self) -> Constraint | None:
        """SGLang's constrained-decoding fields as the engine's :class:`Constraint` (at most one is set)."""
        for kind in ("json_schema", "regex", "ebnf"):
            spec = getattr(self, kind)
            if spec is not None:
                return Constraint(kind, spec)
        return None

    @model_validator(mode="after")
    def _only_neutral(self) -> SGLangSamplingParams:
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value not in neutral:
                raise ValueError(f"{name}={value!r} is not supported by the embedded engine "
                                 f"(accepted: {', '.join(map(repr, neutral))})")
        return self


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SGLangSamplingParams = Field(default_factory=SGLangSamplingParams)
    stream: bool = False
    rid: str | None = Field(default=None, min_length=1, max_length=256)
    cache_salt: CacheSalt = None
    """SGLang's (and vLLM's) field: requests with different salts never share cached KV."""

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("send exactly one of text or input_ids")
        prompt = self.text if self.text is not None else self.input_ids
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            raise ValueError("batched /generate requests are not supported; send one prompt per request")
        if not prompt:
            raise ValueError("the prompt is empty")
        if isinstance(prompt, list) and min(prompt) < 0:  # type: ignore[type-var]
            raise ValueError("input_ids must be >= 0")
        return self


def _finish_reason(result: GenerateResult) -> dict[str, Any]:
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}
    return {"type": result.finish_reason}


def meta_info(rid: str, result: GenerateResult) -> dict[str, Any]:
    return {
        "id": rid,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "cached_tokens": result.cached_tokens,
        "finish_reason": _finish_reason(result),
        "e2e_latency": result.total_s,
    }


def _check_schema_text(text: str) -> None:
    try:
        schema = json.loads(text)
    except ValueError:
        return  # the grammar compiler's own "not JSON" message, with the field named
    schemas.check_enforceable(schema, "sampling_params.json_schema")


def _constraint_field(sp: SGLangSamplingParams) -> str | None:
    constraint = sp.constraint()
    return None if constraint is None else f"sampling_params.{constraint.kind}"


def generate_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = await parse_body(request, GenerateBody)
        sp = body.sampling_params
        if sp.json_schema is not None:
            _check_schema_text(sp.json_schema)
        hint = read_hint({"sampling_params": {"custom_params": sp.custom_params}}, route="generate")
        fixed = hint.fixed_prefix if hint is not None else None
        prompt = body.text if body.text is not None else body.input_ids  # one unbatched prompt (validated)
        encoded = ctx.encode_prompt(prompt, fixed, "input_ids")  # type: ignore[arg-type]
        sampling = ctx.sampling(
            max_tokens=sp.max_new_tokens, default_max_tokens=DEFAULT_MAX_NEW_TOKENS,
            field="sampling_params.max_new_tokens", temperature=sp.temperature, top_p=sp.top_p,
            seed=sp.sampling_seed, stop=sp.stop, ignore_eos=sp.ignore_eos, top_k=max(sp.top_k, 0), min_p=sp.min_p,
            frequency_penalty=sp.frequency_penalty, presence_penalty=sp.presence_penalty,
            repetition_penalty=sp.repetition_penalty,
        )
        greq = GenerateRequest(input_ids=encoded.input_ids, sampling=sampling, hint=hint,
                               fixed_prefix_tokens=encoded.fixed_prefix_tokens, constraint=sp.constraint(),
                               cache_salt=body.cache_salt,
                               **({"request_id": body.rid} if body.rid else {}))
        ctx.submit("generate", greq)
        if not body.stream:
            result = await complete(request, ctx, greq, "text", _constraint_field(sp))
            return JSONResponse({"text": result.text, "output_ids": list(result.output_ids),
                                 "meta_info": meta_info(greq.request_id, result)})
        text, ids = "", []
        started = time.perf_counter()

        def render(event: StreamEvent) -> Iterable[dict[str, Any]]:
            nonlocal text
            text += event.text_delta
            if event.token_id is not None:
                ids.append(event.token_id)
            if event.result is not None:
                yield {"text": event.result.text, "output_ids": list(event.result.output_ids),
                       "meta_info": meta_info(greq.request_id, event.result)}
            elif event.text_delta or event.token_id is not None:
                yield {"text": text, "output_ids": list(ids),
                       "meta_info": {"id": greq.request_id, "completion_tokens": len(ids), "finish_reason": None,
                                     "e2e_latency": time.perf_counter() - started}}

        return sse_response(*await open_stream(request, ctx, greq, "text", _constraint_field(sp)), render)

    return router
