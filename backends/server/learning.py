"""Learned hints on the OpenAI routes: the embedded server's calls into :mod:`backends.learn`.

On ``/v1/chat/completions`` and ``/v1/completions`` every request meets the traffic learner before
the engine: a request without a hint leaves with the learned one, which then takes the declared
hints' path (``GenerateRequest.hint`` -> the engine's intake). Replies are reported back so that the
next request of the session links to it. Sessions that ended are told to the engine as ``done``
steps updates. ``GET /kvflow/v1/learned`` shows the learned agents and transitions (no prompts, no
session ids); ``kvflow graph --server URL`` prints it.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from fastapi import APIRouter, Request

from backends.learn import Learned, session_headers
from backends.learn.host import learned_view
from backends.learn.host import learner_stats as stats_of
from backends.server.errors import APIError
from backends.server.serving import ServerContext
from kvflow_orch.protocol import LEARNED_ROUTE, KVFlowHint

__all__ = ["learned_hint", "learned_reply", "learned_router", "learner_stats"]


def learned_hint(request: Request, ctx: ServerContext, route: Literal["chat", "completions"],
                 body: Mapping[str, Any], declared: KVFlowHint | None) -> tuple[KVFlowHint | None, Learned | None]:
    """The hint the request is served under (the declared one wins) and the learner's record of it.
    ``body``: the JSON object the route validated (:func:`~backends.server.serving.parse_json_body`:
    one parse serves the route and the learner)."""
    learner = ctx.learner
    if learner is None:
        return declared, None
    learned = learner.observe(body, route=route, headers=session_headers(request.headers.raw), declared=declared)
    for update in learner.ended():
        ctx.engine.apply_steps(update)
    return learned.hint, learned


def learned_reply(ctx: ServerContext, learned: Learned | None, message: Mapping[str, Any]) -> None:
    """``message``: the reply as the client gets it (an assistant message, or ``{"content": text}``)."""
    if ctx.learner is not None and learned is not None:
        ctx.learner.reply(learned, message)


def learner_stats(ctx: ServerContext) -> dict[str, Any]:
    """The ``learner`` part of ``/kvflow/v1/stats`` (and of ``/metrics``, as ``kvflow_learner_*``)."""
    return stats_of(ctx.learner)


def learned_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.api_route(LEARNED_ROUTE, methods=["GET", "HEAD"])
    async def learned() -> dict[str, Any]:
        if ctx.learner is None:
            raise APIError(404, "the traffic learner is off on this server (started with --no-learned-hints)",
                           code="learner_off")
        return learned_view(ctx.learner)

    return router
