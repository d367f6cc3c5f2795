"""The routes a gateway or SGLang's tools ask a worker for, answered with the engine's own figures.

SGLang's model gateway (``smg``) and its router probe a worker at start-up (``/version``,
``/model_info``, ``/server_info``, ``/loads``, ``/v1/loads``) to learn its model and kind, and
then poll ``/get_load`` and ``/health_generate`` to balance and watch it; ``/flush_cache`` is fanned
out to every worker. Each answer here is read from the engine at the time of the request:
``info()`` (model, capacities, policy) and ``stats()`` (running and waiting requests, KV tokens in
use, cache counters). The shapes follow SGLang's (``num_running_reqs``, ``num_used_tokens``,
``model_path``, ...), so a gateway registers a kvflow worker under its model name and balances by
real load. ``POST /flush_cache`` drops every cached prefix through the engine's
``flush_cache()`` when it is idle and answers 400 ``server_busy`` while requests run (as SGLang
does: a flush never takes KV from under a request). Failures use the server's OpenAI error shape.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from backends.base import EngineBusy, GenerateRequest, SamplingParams
from backends.server.errors import APIError
from backends.server.serving import ServerContext

__all__ = ["worker_router", "WORKER_ROUTES", "load_figures"]

WORKER_ROUTES = ("/version", "/loads", "/v1/loads", "/health_generate", "/get_model_info", "/model_info",
                 "/get_server_info", "/server_info", "/get_load", "/flush_cache")
HEALTH_GENERATE_TIMEOUT_S = 30.0


def load_figures(ctx: ServerContext) -> dict[str, Any]:
    """One worker's load in SGLang's ``/v1/loads`` terms, from ``engine.stats()`` and ``info()``."""
    stats = ctx.engine.stats()
    running, waiting = int(stats.get("running", 0)), int(stats.get("waiting", 0))
    used, total = int(stats.get("device_used", 0)), int(stats.get("device_total", 0))
    hits = sum(int(stats.get(k, 0)) for k in ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens"))
    prompt = hits + int(stats.get("recomputed_tokens", 0))
    return {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_used_tokens": used,
        "num_total_tokens": total,
        "max_total_num_tokens": total,
        "token_usage": round(used / total, 6) if total else 0.0,
        "cache_hit_rate": round(hits / prompt, 6) if prompt else 0.0,
        "utilization": round(used / total, 6) if total else 0.0,
    }


def _model_info(ctx: ServerContext) -> dict[str, Any]:
    name = ctx.engine.model_name
    return {"model_path": name, "served_model_name": name, "tokenizer_path": name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False}


def _version(ctx: ServerContext) -> str:
    return str(ctx.engine.info().get("version", "unknown"))


def worker_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    started = time.time()

    @router.api_route("/version", methods=["GET", "HEAD"])
    async def version() -> dict[str, Any]:
        return {"version": _version(ctx)}

    @router.api_route("/model_info", methods=["GET", "HEAD"])
    @router.api_route("/get_model_info", methods=["GET", "HEAD"])
    async def model_info() -> dict[str, Any]:
        return _model_info(ctx)

    @router.api_route("/server_info", methods=["GET", "HEAD"])
    @router.api_route("/get_server_info", methods=["GET", "HEAD"])
    async def server_info() -> dict[str, Any]:
        info = ctx.engine.info()
        load = load_figures(ctx)
        return {
            **_model_info(ctx),
            "version": _version(ctx),
            "startup_time": started,
            "max_total_num_tokens": load["max_total_num_tokens"],
            "context_length": info.get("context_length"),
            "max_running_requests": info.get("max_batch"),
            "dp_size": 1,
            "tp_size": 1,
            "internal_states": [{**load, "kvflow": ctx.engine.stats()}],
            "kvflow": info,
        }

    @router.api_route("/loads", methods=["GET", "HEAD"])
    @router.api_route("/v1/loads", methods=["GET", "HEAD"])
    async def loads(model: str | None = None, dp_rank: str | None = None, include: str | None = None,
                    format: str | None = None) -> dict[str, Any]:
        # Parameters arrive as strings and are checked here, so every refusal has the OpenAI shape.
        if model is not None and model not in ctx.model_names:
            raise APIError(404, f"model {model!r} is not served here; this worker serves {ctx.engine.model_name!r}",
                           code="model_not_found", param="model")
        if dp_rank not in (None, "0"):
            raise APIError(400, f"dp_rank {dp_rank} does not exist; this worker has one rank, 0",
                           code="invalid_value", param="dp_rank")
        if format not in (None, "json"):
            raise APIError(400, f"format {format!r} is not offered; use json", code="invalid_value", param="format")
        return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": _version(ctx),
                "accelerator": None, "num_accelerators": 1, "loads": [load_figures(ctx)]}

    @router.api_route("/get_load", methods=["GET", "HEAD"])
    async def get_load() -> list[dict[str, Any]]:
        load = load_figures(ctx)
        # SGLang's older per-rank shape, plus the total a load balancer compares.
        return [{"dp_rank": 0, "num_reqs": load["num_running_reqs"], "num_waiting_reqs": load["num_waiting_reqs"],
                 "num_tokens": load["num_used_tokens"],
                 "load": load["num_running_reqs"] + load["num_waiting_reqs"]}]

    @router.api_route("/health_generate", methods=["GET", "HEAD"])
    async def health_generate() -> dict[str, Any]:
        load = load_figures(ctx)
        if load["num_running_reqs"] or load["num_waiting_reqs"]:
            return {"status": "ok", "generated": False}  # busy: serving proves health, as SGLang does
        token = next(iter(ctx.engine.tokenizer.eos_token_ids), 0)
        request = GenerateRequest(input_ids=(token,), sampling=SamplingParams(max_tokens=1, temperature=0.0))
        try:
            await asyncio.wait_for(ctx.engine.generate(request), HEALTH_GENERATE_TIMEOUT_S)
        except Exception as exc:  # any failure is "unhealthy", said in the shape clients parse
            raise APIError(503, f"the engine could not generate one token: {type(exc).__name__}: {exc}",
                           code="engine_unhealthy", type="server_error") from None
        return {"status": "ok", "generated": True}

    # POST only (what smg fans out, without a body): a GET must not change state, or a link or an
    # <img> on any web page would flush the cache. Bodiless, so it is left out of the schema: it
    # would offer fuzzers nothing to send invalid.
    @router.api_route("/flush_cache", methods=["POST"], include_in_schema=False)
    async def flush_cache() -> JSONResponse:
        flush = getattr(ctx.engine, "flush_cache", None)
        if flush is None:
            raise APIError(400, f"this engine ({type(ctx.engine).__name__}) cannot flush its KV cache; "
                                "nothing was changed", code="not_supported")
        load = load_figures(ctx)
        if load["num_running_reqs"] or load["num_waiting_reqs"]:
            raise _busy(f"not flushed: {load['num_running_reqs']} running and {load['num_waiting_reqs']} "
                        "waiting requests hold the cache; retry when idle")
        before = load["num_used_tokens"]
        try:
            result = flush()
            if asyncio.iscoroutine(result):
                result = await result
        except EngineBusy as exc:  # a request arrived between the check and the flush
            raise _busy(str(exc)) from None
        freed = result._asdict() if hasattr(result, "_asdict") else {}  # the embedded engine's FlushResult
        return JSONResponse({"status": "ok", "flushed_tokens": before - load_figures(ctx)["num_used_tokens"],
                             **{f"freed_{k}": v for k, v in freed.items()}})

    return router


def _busy(message: str) -> APIError:
    """SGLang answers a flush refused for running requests with 400; so does this route."""
    return APIError(400, message, code="server_busy")
