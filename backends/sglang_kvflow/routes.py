"""The kvflow HTTP routes on SGLang's FastAPI app (main process only).

* ``POST /kvflow/v1/steps``: a :class:`~kvflow_orch.protocol.StepsUpdate`; validated here (422 with
  a message naming the field), then sent to the scheduler as a :class:`KVFlowStepsReq`.
* ``GET /kvflow/v1/info``: backend, versions, policy, tiers and capacities (what the runtime probes).
* ``GET /kvflow/v1/stats``: every DP rank's counters and occupancy, summed.

* ``GET /kvflow/v1/learned``: what the traffic learner learned (404 while it is off).

Learned hints (``KVFLOW_LEARNED_HINTS=on``, which ``kvflow serve --engine sglang --learned-hints``
sets): :class:`backends.learn.asgi.LearningMiddleware` on the app gives a request without a hint the
learned one as ``custom_params.kvflow``, which then takes the declared hints' path
(:func:`~.hints_bridge.validate_generate_request`, the scheduler's intake); a learned session that
ends reaches the scheduler as a ``done`` steps update.

Continuations (issue 24; the rule is the brain's): :class:`SessionMiddleware` passes a chat or
completion request's explicit session key (``prompt_cache_key``, else ``user``) to the scheduler as
``custom_params.kvflow_session`` (stamped with the HTTP side's clock, which every TP rank expires
continuations by), and when a chat reply of a session (that key, or the hint's agent) calls tools,
sends a :class:`~.hints_bridge.KVFlowPauseReq` before the reply's last bytes reach the client.

SGLang's own middleware (``--api-key``) covers these routes like every other.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from fastapi import Request
from fastapi.responses import JSONResponse

from backends.kvcache.intake import RequestIntake
from backends.learn import TrafficLearner
from backends.learn.asgi import MAX_BODY_BYTES, LearningMiddleware, read_body, replay
from backends.learn.host import learned_view, learner_from_env, learner_stats
from backends.pause_watch import offers_tools, parsed_body, rebodied, session_key, watch_replies
from kvflow_orch.protocol import (CUSTOM_PARAMS, INFO_ROUTE, LEARNED_ROUTE, STATS_ROUTE, STEPS_ROUTE, HintError,
                                  StepsUpdate, extract_hint, read_steps_update, steps_as_json)

from .hints_bridge import SESSION_KEY, KVFlowPauseReq, KVFlowStatsReq, KVFlowStepsReq
from .stats import merge_stats

__all__ = ["install_routes", "info_payload", "SessionMiddleware", "with_session", "SESSION_ROUTES"]

SESSION_ROUTES = ("/v1/chat/completions", "/v1/completions")

PROTOCOL_VERSION = 1
_learner: TrafficLearner | None = None  # the app's (install_routes sets it; one app per process)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _not_running() -> JSONResponse:
    return _error(503, "the SGLang tokenizer manager is not running yet", "server_error")


def _tokenizer_manager() -> Any:
    from sglang.srt.entrypoints import http_server

    state = http_server.get_global_state()
    return None if state is None else state.tokenizer_manager


async def post_steps(request: Request) -> JSONResponse:
    try:
        update = read_steps_update(await request.body())
    except HintError as exc:
        return _error(exc.status, str(exc))
    if not await _dispatch(update):
        return _not_running()
    return JSONResponse({"ok": True, "workflow_id": update.workflow_id, "agents": len(update.steps),
                         "done": update.done})


async def _dispatch(update: StepsUpdate) -> bool:
    """Send a validated steps update to the scheduler; False while the tokenizer manager is not up."""
    manager = _tokenizer_manager()
    if manager is None:
        return False
    await manager._async_dispatch_to_scheduler(KVFlowStepsReq(
        workflow_id=update.workflow_id, namespace=update.namespace, steps=steps_as_json(update.steps), done=update.done,
        sent_at=time.time(),
    ))
    return True


async def _pause(session: tuple[str, str], tools: list[str]) -> None:
    """A reply of ``session`` called ``tools``: the scheduler keeps its conversation."""
    manager = _tokenizer_manager()
    if manager is not None:
        await manager._async_dispatch_to_scheduler(KVFlowPauseReq(namespace=session[0], key=session[1],
                                                                  tools=tools, sent_at=time.time()))


def with_session(body: dict[str, Any], sent_at: float) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    """``(body with custom_params.kvflow_session, the session)`` for a request with an explicit
    session key; ``(None, session)`` when only its hint gives one (nothing to rewrite); ``(None,
    None)`` without either. Raises :class:`HintError` naming a bad session field."""
    key = session_key(body)
    try:
        hint = extract_hint(body, location=CUSTOM_PARAMS)
    except HintError:
        hint = None  # SGLang's own validation answers it (validate_generate_request: a 400)
    session = RequestIntake.session_of(hint, key)
    custom = body.get("custom_params")
    if key is None or (custom is not None and not isinstance(custom, dict)):
        return None, session
    return {**body, "custom_params": {**(custom or {}), SESSION_KEY: {"key": key, "sent_at": sent_at}}}, session


class SessionMiddleware:
    """Pure ASGI on :data:`SESSION_ROUTES` (see the module docstring)."""

    def __init__(self, app: Any, pause: Any = _pause) -> None:
        self.app = app
        self.pause = pause

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in SESSION_ROUTES:
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        if raw is None:
            return
        body = parsed_body(scope, raw) if len(raw) <= MAX_BODY_BYTES else None
        if not isinstance(body, dict):
            await self.app(scope, replay(raw, receive), send)
            return
        try:
            new, session = with_session(body, time.time())
        except HintError as exc:
            await _error(400, str(exc))(scope, receive, send)
            return
        if new is not None:
            scope, raw = rebodied(scope, new)
        if session is not None and offers_tools(body, scope["path"]):
            send = watch_replies(send, session, self.pause)
        await self.app(scope, replay(raw, receive), send)


def info_payload(server_args: Any) -> dict[str, Any]:
    import sglang

    from .state import PluginConfig

    policy = getattr(server_args, "radix_eviction_policy", "lru")
    hicache = bool(getattr(server_args, "enable_hierarchical_cache", False))
    options = getattr(server_args, "radix_eviction_policy_config", None) or {}
    if isinstance(options, str):
        options = json.loads(options)
    config = PluginConfig.from_options(options) if policy == "kvflow" else None
    return {
        "backend": "sglang",
        "protocol": PROTOCOL_VERSION,
        "sglang_version": sglang.__version__,
        "policy": policy,
        "prefetch": bool(config and config.cache.prefetch and hicache),
        "prefetch_lookahead": config.cache.prefetch_lookahead if config else None,
        "tiers": ["device", "host"] if hicache else ["device"],
        "hicache_write_policy": getattr(server_args, "hicache_write_policy", None) if hicache else None,
        "capacities": {
            "max_total_tokens": getattr(server_args, "max_total_tokens", None),
            "hicache_ratio": getattr(server_args, "hicache_ratio", None) if hicache else None,
            "hicache_size_gb": getattr(server_args, "hicache_size", None) if hicache else None,
        },
        "hints": {"openai": [CUSTOM_PARAMS]},  # what hints_bridge reads
        "routes": {"steps": STEPS_ROUTE, "stats": STATS_ROUTE, "learned": LEARNED_ROUTE},
        "learned_hints": _learner is not None,
    }


async def get_info() -> JSONResponse:
    manager = _tokenizer_manager()
    if manager is None:
        return _not_running()
    return JSONResponse(info_payload(manager.server_args))


async def get_stats() -> JSONResponse:
    manager = _tokenizer_manager()
    if manager is None:
        return _not_running()
    communicator = getattr(manager, "kvflow_stats_communicator", None)
    if communicator is None:
        return _error(503, "kvflow stats are unavailable: the plugin is not loaded in the tokenizer manager",
                      "server_error")
    replies = await communicator.queueing_call(KVFlowStatsReq())
    return JSONResponse({**merge_stats(reply.stats for reply in replies), "learner": learner_stats(_learner)})


async def get_learned() -> JSONResponse:
    if _learner is None:
        return _error(404, "the traffic learner is off on this server (start it with --learned-hints)")
    return JSONResponse(learned_view(_learner))


def install_routes(app: Any, environ: Mapping[str, str] | None = None) -> None:
    """Add the routes once (idempotent), and the learner's middleware when ``KVFLOW_LEARNED_HINTS``
    is on in ``environ`` (default: the process's); call before uvicorn starts serving ``app``."""
    global _learner
    existing = {getattr(route, "path", None) for route in app.routes}
    if LEARNED_ROUTE not in existing:
        app.add_api_route(LEARNED_ROUTE, get_learned, methods=["GET"])
        app.add_middleware(SessionMiddleware)  # before the learner's: inside it, so it sees learned hints
        _learner = learner_from_env(environ)
        if _learner is not None:
            app.add_middleware(LearningMiddleware, learner=_learner, done=_dispatch, locations=(CUSTOM_PARAMS,))
    if STEPS_ROUTE not in existing:
        app.add_api_route(STEPS_ROUTE, post_steps, methods=["POST"])
    if INFO_ROUTE not in existing:
        app.add_api_route(INFO_ROUTE, get_info, methods=["GET"])
    if STATS_ROUTE not in existing:
        app.add_api_route(STATS_ROUTE, get_stats, methods=["GET"])
