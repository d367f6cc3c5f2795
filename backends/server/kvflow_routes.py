"""kvflow's own routes: ``/kvflow/v1/info``, ``/kvflow/v1/steps``, ``/kvflow/v1/stats`` and ``/health``.

None of them reveals a prompt or a workflow id: info and stats are aggregates, and the steps route
only acknowledges. ``/health`` is the one route that works without the API key.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Request

from backends.server.learning import learner_stats
from backends.server.serving import ServerContext, parse_body
from kvflow_orch.protocol import CUSTOM_PARAMS, INFO_ROUTE, STATS_ROUTE, STEPS_ROUTE, StepsUpdate
from kvflow_orch.protocol.wire import RESPONSES_HINT_LOCATIONS

__all__ = ["kvflow_router", "SERVER_API_VERSION"]

SERVER_API_VERSION = "v1"
StepsObserver = Callable[[StepsUpdate], None]


def kvflow_router(ctx: ServerContext, steps_observer: StepsObserver | None = None) -> APIRouter:
    router = APIRouter()

    @router.api_route(INFO_ROUTE, methods=["GET", "HEAD"])
    async def info() -> dict[str, Any]:
        hints = {"openai": [CUSTOM_PARAMS], "responses": list(RESPONSES_HINT_LOCATIONS)}
        return {**ctx.engine.info(), "api": SERVER_API_VERSION, "hints": hints}

    @router.post(STEPS_ROUTE)
    async def steps(request: Request) -> dict[str, Any]:
        update = await parse_body(request, StepsUpdate, status=422)  # the protocol's status, on every backend
        if steps_observer is not None:
            steps_observer(update)
        ctx.engine.apply_steps(update)
        return {"status": "ok"}

    @router.api_route(STATS_ROUTE, methods=["GET", "HEAD"])
    async def stats() -> dict[str, Any]:
        return {**ctx.engine.stats(), "learner": learner_stats(ctx)}

    @router.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return router
