"""The ``vllm.endpoint_plugins`` entry point: kvflow's HTTP surface on vLLM's OpenAI server.

* ``POST /kvflow/v1/steps``: a :class:`~kvflow_orch.protocol.StepsUpdate`, validated here (422
  naming the field), then handed to the scheduler by the ``kvflow_call`` utility (:mod:`.plugin`);
* ``GET /kvflow/v1/info``: backend, versions, policy, block size, capacities, where hints go;
* ``GET /kvflow/v1/stats``: the scheduler's counters (the brain's CacheStats names, ``workflows``).

Hints: vLLM hands ``kv_transfer_params`` (any JSON) to the scheduler's ``Request``; kvflow's one
client puts hints in ``custom_params.kvflow``, which vLLM accepts and drops. A middleware on
``/v1/chat/completions`` and ``/v1/completions`` validates either placement (400 naming the
field), moves ``custom_params.kvflow`` to ``kv_transfer_params.kvflow``, and turns the hint's
``fixed_prefix`` (leading messages, or characters of a text prompt) into tokens with the served
model's tokenizer and chat template, so the scheduler tags exactly the fixed prompt. It also takes
``/v1/responses`` (vLLM hands its ``kv_transfer_params`` to the scheduler as chat's), for the
session key and the hint; a response's ``fixed_prefix`` is not turned into tokens.

Continuations (issue 24; the rule is the brain's, :mod:`backends.kvcache.continuations`): the same
middleware passes a request's explicit session key (``prompt_cache_key``, else ``user``) to the
scheduler as ``kv_transfer_params.kvflow_session``, and watches the reply of a chat or responses
request that offers tools and has a session (that key, or its hint's agent): when the reply calls
tools (a chat message's ``tool_calls`` or a response's ``function_call`` items, in its JSON body or
its stream's events), the ``pause`` verb reaches the scheduler before the reply's last bytes reach
the client, so the conversation is kept before the agent can return.

Learned hints (``KVFLOW_LEARNED_HINTS=on``, which ``kvflow serve --engine vllm --learned-hints``
sets): :class:`backends.learn.asgi.LearningMiddleware` runs before the hint middleware, so a
request without a hint reaches it carrying the learned one and takes the declared hints' path; the
learner's counts join ``/kvflow/v1/stats`` (``learner``) and ``GET /kvflow/v1/learned`` shows what
it learned.

vLLM's ``--api-key`` guards ``/v1`` only: these routes check the same key themselves.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from backends.learn.asgi import MAX_BODY_BYTES, LearningMiddleware, read_body, replay
from backends.learn.host import learned_view, learner_from_env, learner_stats
from backends.kvcache.intake import RequestIntake
from backends.pause_watch import offers_tools, parsed_body, rebodied, session_key, watch_replies
from kvflow_orch.protocol import (CUSTOM_PARAMS, INFO_ROUTE, KV_TRANSFER_PARAMS, LEARNED_ROUTE, STATS_ROUTE,
                                  STEPS_ROUTE, HintError, StepsUpdate, extract_hint, read_steps_update)

from . import PLUGIN_NAME, UTILITY
from .state import HINT_KEY, PREFIX_TOKENS_KEY, SESSION_KEY, read_hint, read_session

__all__ = ["KVFlowEndpoints", "rewrite_body", "pause_session", "PROTOCOL_VERSION", "HINT_ROUTES"]

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
HINT_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _template_ids(tokenizer: Any, messages: list[Any]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def rewrite_body(body: dict[str, Any], route: str, tokenizer: Any | None) -> dict[str, Any] | None:
    """The body with its hint and session key where the scheduler reads them; ``None`` when it
    carries neither. Raises :class:`HintError` naming the problem."""
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise HintError("kv_transfer_params must be an object")
    hint = extract_hint(body, location=CUSTOM_PARAMS) or extract_hint(body, location=KV_TRANSFER_PARAMS)
    key = session_key(body)
    if hint is None and key is None:
        return None
    params = dict(params or {})
    if key is not None:
        params[SESSION_KEY] = key
    if hint is None:
        return {**body, "kv_transfer_params": params}
    params[HINT_KEY] = hint.model_dump(mode="json")
    if hint.fixed_prefix is not None and tokenizer is not None and PREFIX_TOKENS_KEY not in params:
        if route.endswith("chat/completions") and isinstance(body.get("messages"), list):
            fixed = body["messages"][: hint.fixed_prefix]
            params[PREFIX_TOKENS_KEY] = len(_template_ids(tokenizer, fixed)) if fixed else 0
        elif isinstance(body.get("prompt"), str):
            params[PREFIX_TOKENS_KEY] = len(tokenizer.encode(body["prompt"][: hint.fixed_prefix]))
    out = {k: v for k, v in body.items() if k != "custom_params"}
    rest = {k: v for k, v in (body.get("custom_params") or {}).items() if k != "kvflow"}
    if rest:
        out["custom_params"] = rest
    out["kv_transfer_params"] = params
    return out


def pause_session(body: dict[str, Any], route: str) -> tuple[str, str] | None:
    """The session a rewritten chat or responses request pauses if its reply calls tools (read as
    the scheduler reads it: :func:`~.state.read_hint`, :func:`~.state.read_session`); ``None``: the
    request offers no tools or has no session."""
    if not offers_tools(body, route):
        return None
    params = body.get("kv_transfer_params")
    found = read_hint(params)
    return RequestIntake.session_of(found[0] if found else None, read_session(params))


class _HintMiddleware:
    """Pure ASGI: rewrites hinted chat/completions bodies (see :func:`rewrite_body`)."""

    def __init__(self, app: Any, tokenizer_of: Callable[[], Any],
                 pause: Callable[[tuple[str, str], list[str]], Any] | None = None) -> None:
        self.app = app
        self.tokenizer_of = tokenizer_of
        self.pause = pause

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in HINT_ROUTES:
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        if raw is None:
            return
        if len(raw) > MAX_BODY_BYTES:
            await _error(413, f"request body over {MAX_BODY_BYTES} bytes")(scope, receive, send)
            return
        body = parsed_body(scope, raw)
        try:
            new = rewrite_body(body, scope["path"], self.tokenizer_of()) if isinstance(body, dict) else None
        except HintError as exc:  # a ValueError too: caught before anything broader
            await _error(400, str(exc))(scope, receive, send)
            return
        if new is not None:
            scope, raw = rebodied(scope, new)
            session = pause_session(new, scope["path"]) if self.pause is not None else None
            if session is not None:
                send = watch_replies(send, session, self.pause)
        await self.app(scope, replay(raw, receive), send)

class KVFlowEndpoints:
    """The endpoint plugin vLLM instantiates (allow it with ``VLLM_PLUGINS=kvflow``)."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self.engine: Any = None
        self.api_key: str | None = None
        self.args: Any = None
        self.tokenizer: Any = None
        self.learner = learner_from_env()

    def attach_router(self, app: FastAPI) -> None:
        app.add_api_route(STEPS_ROUTE, self.post_steps, methods=["POST"])
        app.add_api_route(INFO_ROUTE, self.get_info, methods=["GET"])
        app.add_api_route(STATS_ROUTE, self.get_stats, methods=["GET"])
        app.add_api_route(LEARNED_ROUTE, self.get_learned, methods=["GET"])
        app.add_middleware(_HintMiddleware, tokenizer_of=lambda: self.tokenizer, pause=self._pause)
        if self.learner is not None:  # added last: the outermost, so the hint middleware sees learned hints
            app.add_middleware(LearningMiddleware, learner=self.learner, done=self._workflow_done,
                               locations=(CUSTOM_PARAMS, KV_TRANSFER_PARAMS))

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        self.engine, self.args = engine_client, args
        self.api_key = getattr(args, "api_key", None)
        if isinstance(self.api_key, list):
            self.api_key = self.api_key[0] if self.api_key else None
        renderer = getattr(engine_client, "renderer", None)
        if renderer is not None:
            self.tokenizer = renderer.get_tokenizer()

    # ---- helpers -------------------------------------------------------------------------------
    def _refuse(self, request: Request) -> JSONResponse | None:
        if self.engine is None:
            return _error(503, "the vLLM engine is not running", "server_error")
        if self.api_key:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                return _error(401, "missing or wrong API key ('Authorization: Bearer K')", "authentication_error")
        return None

    async def _call(self, verb: str, payload: Any = None, *, every_engine: bool = False) -> Any:
        core = self.engine.engine_core
        if every_engine and hasattr(core, "call_utility_all_async"):
            return (await core.call_utility_all_async(UTILITY, verb, payload))[0]
        return await core.call_utility_async(UTILITY, verb, payload)

    async def _pause(self, session: tuple[str, str], tools: list[str]) -> None:
        """A reply called ``tools``: the scheduler keeps the session's conversation (the brain's
        rule); a failure is logged, never the client's: its reply stands."""
        if self.engine is not None:
            try:
                await self._call("pause", {"session": list(session), "tools": tools}, every_engine=True)
            except Exception:
                logger.warning("kvflow: the pause of a session did not reach the scheduler", exc_info=True)

    async def _workflow_done(self, update: StepsUpdate) -> None:
        """A learned session ended: its workflow's steps leave every scheduler's table."""
        if self.engine is not None:
            await self._call("steps", update.model_dump(mode="json"), every_engine=True)

    def _model_name(self) -> str | None:
        served = getattr(self.args, "served_model_name", None)
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        return served or getattr(self.args, "model", None)

    # ---- routes --------------------------------------------------------------------------------
    async def post_steps(self, request: Request) -> JSONResponse:
        if (refused := self._refuse(request)) is not None:
            return refused
        try:
            update = read_steps_update(await request.body())
        except HintError as exc:
            return _error(exc.status, str(exc))
        reply = await self._call("steps", update.model_dump(mode="json"), every_engine=True)
        return JSONResponse({"ok": True, "workflow_id": update.workflow_id, "agents": len(update.steps),
                             "done": update.done, **({"ignored": reply["ignored"]} if "ignored" in reply else {})})

    async def get_info(self, request: Request) -> JSONResponse:
        if (refused := self._refuse(request)) is not None:
            return refused
        import vllm

        core = await self._call("info")
        config = getattr(self.engine, "vllm_config", None)
        cache = getattr(config, "cache_config", None)
        return JSONResponse({
            "backend": "vllm",
            "protocol": PROTOCOL_VERSION,
            "model": self._model_name(),
            "vllm_version": vllm.__version__,
            "policy": core.get("policy", "lru"),
            "prefetch": False,
            "tiers": ["device", "host"] if getattr(getattr(config, "kv_transfer_config", None), "kv_connector",
                                                   None) == "OffloadingConnector" else ["device"],
            "capacities": {
                "block_size": getattr(cache, "block_size", None),
                "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
                "device_tokens": core.get("device_tokens"),
            },
            # vLLM's own field first: it reaches Request.kv_transfer_params as sent
            "hints": {"openai": [KV_TRANSFER_PARAMS, CUSTOM_PARAMS]},
            "routes": {"steps": STEPS_ROUTE, "stats": STATS_ROUTE, "learned": LEARNED_ROUTE},
            "learned_hints": self.learner is not None,
        })

    async def get_stats(self, request: Request) -> JSONResponse:
        if (refused := self._refuse(request)) is not None:
            return refused
        return JSONResponse({**await self._call("stats"), "learner": learner_stats(self.learner)})

    async def get_learned(self, request: Request) -> JSONResponse:
        if (refused := self._refuse(request)) is not None:
            return refused
        if self.learner is None:
            return _error(404, "the traffic learner is off on this server (start it with --learned-hints)")
        return JSONResponse(learned_view(self.learner))
