"""What every plugin host (vLLM's, SGLang's) reads off OpenAI traffic for continuations
(:mod:`backends.kvcache.continuations`): a request's explicit session key, and the tools its reply
calls, watched on the way out so the host pauses the session before the agent can return. The
rule (what is kept, until when) is the brain's; the hosts call its verbs. Not a host: both plugins
import it (no engine import here).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from backends.learn.asgi import BODY_SCOPE_KEY
from kvflow_orch.protocol import MAX_NAME_LEN, HintError

__all__ = ["SESSION_FIELDS", "SessionRef", "session_key", "offers_tools", "ToolCallWatch", "watch_replies",
           "parsed_body", "rebodied"]

SESSION_FIELDS = ("prompt_cache_key", "user")  # OpenAI's session fields, the first given wins
MAX_WATCHED_BYTES = 16 * 2**20  # a longer JSON reply is not parsed for tool calls
SessionRef = tuple[str, str]


def session_key(body: dict[str, Any]) -> str | None:
    """The request's explicit session key: ``prompt_cache_key``, else ``user`` (``None``: neither).
    Raises :class:`HintError` naming a field that is not a non-empty name of at most
    ``MAX_NAME_LEN`` characters (the embedded server's limit)."""
    found = None
    for name in SESSION_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_LEN:
            raise HintError(f"{name} must be a non-empty string of at most {MAX_NAME_LEN} characters")
        found = found or value
    return found


def offers_tools(body: dict[str, Any], route: str) -> bool:
    """Whether a request is a chat completion or a response (``/v1/responses``) that offers tools
    (only its reply can call one)."""
    return route.endswith(("chat/completions", "/responses")) and bool(body.get("tools"))


class ToolCallWatch:
    """The names of the tools a reply calls, from its JSON body or its server-sent events: a chat
    completion's ``tool_calls`` (in its message, or its deltas), or a response's ``function_call``
    output items (in its ``output``, or each ``response.output_item.done`` event; the items of the
    closing ``response.completed`` were announced already)."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.tools: list[str] = []
        self._buffer = b""
        self._too_long = False

    def feed(self, chunk: bytes) -> None:
        if not self.streaming:
            self._too_long = self._too_long or len(self._buffer) + len(chunk) > MAX_WATCHED_BYTES
            if not self._too_long:
                self._buffer += chunk
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                self._read(line[5:], "delta")

    def finish(self) -> list[str]:
        if not self.streaming and not self._too_long:
            self._read(self._buffer, "message")
        elif self.streaming and self._buffer:
            self.feed(b"\n")
        return self.tools

    def _read(self, raw: bytes, field: str) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        for choice in data.get("choices") or []:
            message = choice.get(field) if isinstance(choice, dict) else None
            for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
                function = call.get("function") if isinstance(call, dict) else None
                self._add(function.get("name") if isinstance(function, dict) else None)
        if field == "message":
            items = data.get("output") or []
        else:
            items = [data.get("item")] if data.get("type") == "response.output_item.done" else []
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                self._add(item.get("name"))

    def _add(self, name: Any) -> None:
        if isinstance(name, str) and name:
            self.tools.append(name)


def watch_replies(send: Callable, session: SessionRef, pause: Callable[[SessionRef, list[str]], Awaitable[Any]]
                  ) -> Callable:
    """ASGI ``send`` that awaits ``pause(session, tools)`` before the last bytes of a successful
    reply that called ``tools`` (its JSON body, or the deltas of its event stream)."""
    watch: list[ToolCallWatch] = []

    async def watched(message: dict) -> None:
        if message["type"] == "http.response.start":
            if message.get("status") == 200:
                kind = dict(message.get("headers") or ()).get(b"content-type", b"")
                watch.append(ToolCallWatch(streaming=kind.startswith(b"text/event-stream")))
        elif message["type"] == "http.response.body" and watch:
            watch[0].feed(message.get("body", b""))
            if not message.get("more_body", False):
                tools = watch.pop().finish()
                if tools:
                    await pause(session, tools)
        await send(message)

    return watched


def parsed_body(scope: dict, raw: bytes) -> Any:
    """A request's JSON body: as the learner's middleware left it in ``scope``, else ``raw``
    parsed (``None``: empty or not JSON, which the engine answers as usual)."""
    body = scope.get(BODY_SCOPE_KEY)
    if body is None and raw:
        try:
            body = json.loads(raw)
        except ValueError:
            return None
    return body


def rebodied(scope: dict, body: dict[str, Any]) -> tuple[dict, bytes]:
    """``(scope, raw)`` for a rewritten JSON ``body``: its bytes, and the scope's content-length."""
    raw = json.dumps(body).encode()
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
    return {**scope, "headers": headers + [(b"content-length", str(len(raw)).encode())]}, raw
