"""The learner on a host whose OpenAI routes kvflow does not own (the vLLM and SGLang plugins): a
pure ASGI middleware on ``/v1/chat/completions`` and ``/v1/completions``.

A request without a hint leaves it with the learned hint as ``custom_params.kvflow``, the
placement a declared hint takes on both hosts, so the host's own hint path (its validation, the
fixed-prefix boundary, the scheduler's intake) serves it exactly as a declared one. A request with
a hint, or a body the host will refuse (not JSON, a malformed hint), passes through unchanged; a
declared hint is still counted and owns its session from then on. The reply the client gets is
read back (:func:`.host.reply_of_response`) to link the session's next request; sessions that
ended are handed to the host's ``done`` callback as ``StepsUpdate(done=True)``.

The rewritten body is also left in the ASGI scope under :data:`BODY_SCOPE_KEY`, so that a host
middleware after this one reads it without parsing the bytes again.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Sequence

from pydantic_core import from_json

from kvflow_orch.protocol import CUSTOM_PARAMS, HintError, KVFlowHint, StepsUpdate, attach_hint, extract_hint

from .host import reply_of_response
from .learner import Learned, TrafficLearner
from .requests import session_headers

__all__ = ["LearningMiddleware", "BODY_SCOPE_KEY", "LEARNED_ROUTES", "MAX_BODY_BYTES", "read_body", "replay"]

LEARNED_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
BODY_SCOPE_KEY = "kvflow.body"
MAX_BODY_BYTES = 64 << 20
MAX_REPLY_BYTES = 4 << 20
"""A reply longer than this is not read back (its session still links by its conversation)."""


class LearningMiddleware:
    """``locations``: where the host reads declared hints (:data:`kvflow_orch.protocol.HINT_LOCATIONS`)."""

    def __init__(self, app: Any, learner: TrafficLearner, done: Callable[[StepsUpdate], Awaitable[Any]],
                 locations: Sequence[str] = (CUSTOM_PARAMS,)) -> None:
        self.app, self.learner, self.done, self.locations = app, learner, done, tuple(locations)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        route = LEARNED_ROUTES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        if raw is None:
            return  # the client went away
        if len(raw) > MAX_BODY_BYTES:  # the rest is still to come: the host's own limit answers it
            await self.app(scope, replay(raw, receive, more=True), send)
            return
        learned, new, body = self._learn(scope, route, raw)
        for update in self.learner.ended():
            await self.done(update)
        if body is not None:
            scope = {**scope, BODY_SCOPE_KEY: body}
        if new is not raw:
            headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(new)).encode())]}
            raw = new
        if learned is None:
            await self.app(scope, replay(raw, receive), send)
            return
        await self.app(scope, replay(raw, receive), _ReplyReader(self.learner, learned, route, send))

    def _learn(self, scope: dict, route: str, raw: bytes) -> tuple[Learned | None, bytes, dict | None]:
        try:
            body = from_json(raw, cache_strings=False) if raw else None
        except ValueError:
            return None, raw, None  # not JSON: the host answers it as usual
        if not isinstance(body, dict):
            return None, raw, None
        try:
            declared = self._declared(body)
        except HintError:
            return None, raw, body  # the host refuses it, naming the field
        learned = self.learner.observe(body, route=route, headers=session_headers(scope.get("headers", ())),
                                       declared=declared)
        if learned.source != "learned" or learned.hint is None:
            return learned, raw, body
        body = attach_hint(body, learned.hint, location=CUSTOM_PARAMS)
        return learned, json.dumps(body).encode(), body

    def _declared(self, body: dict) -> KVFlowHint | None:
        for location in self.locations:
            hint = extract_hint(body, location=location)
            if hint is not None:
                return hint
        return None


class _ReplyReader:
    """The ``send`` of a learned request: passes everything on, keeps the body to read the reply."""

    def __init__(self, learner: TrafficLearner, learned: Learned, route: str, send: Callable) -> None:
        self.learner, self.learned, self.route, self.send = learner, learned, route, send
        self.chunks: list[bytes] = []
        self.size = 0
        self.ok = self.streamed = False

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.ok = message.get("status") == 200
            kind = dict(message.get("headers") or ()).get(b"content-type", b"")
            self.streamed = kind.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and self.ok:
            chunk = message.get("body", b"")
            self.size += len(chunk)
            if self.size <= MAX_REPLY_BYTES:
                self.chunks.append(chunk)
            if not message.get("more_body"):
                reply = reply_of_response(self.route, b"".join(self.chunks), self.streamed) \
                    if self.size <= MAX_REPLY_BYTES else None
                if reply is not None:
                    self.learner.reply(self.learned, reply)
                self.chunks = []
        await self.send(message)


async def read_body(receive: Callable) -> bytes | None:
    """The request body, or None when the client went away first; past :data:`MAX_BODY_BYTES` it
    stops reading (the rest is still in ``receive``)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES or not message.get("more_body"):
            return b"".join(chunks)


def replay(raw: bytes, receive: Callable, *, more: bool = False) -> Callable:
    """A ``receive`` that hands over ``raw`` first (``more``: the body goes on in ``receive``)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": raw, "more_body": more}

    return replay
