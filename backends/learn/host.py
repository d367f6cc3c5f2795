"""What every host of the learner does alike: the switch, the two views it serves, and reading
the reply a client got (so that the next request of the session links to it).

The embedded server (``backends/server/learning.py``) calls these from its own routes; the vLLM and
SGLang plugins through :mod:`.asgi`, a middleware on routes they do not own.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from .learner import TrafficLearner

__all__ = ["LEARNED_HINTS_ENV", "learned_hints_env", "learner_from_env", "learner_stats", "learned_view",
           "reply_of_response"]

LEARNED_HINTS_ENV = "KVFLOW_LEARNED_HINTS"
"""``on``/``off``: whether a plugin host (vLLM, SGLang) runs the learner; ``kvflow serve
--learned-hints`` sets it for the engine it launches."""
_ON, _OFF = {"1", "on", "true", "yes"}, {"", "0", "off", "false", "no"}


def learned_hints_env(enabled: bool) -> dict[str, str]:
    """What a launcher adds to a plugin host's environment for ``--learned-hints`` / ``--no-learned-hints``."""
    return {LEARNED_HINTS_ENV: "on" if enabled else "off"}


def learner_from_env(environ: Mapping[str, str] | None = None) -> TrafficLearner | None:
    """A learner when :data:`LEARNED_HINTS_ENV` is on, else None; ValueError naming a bad value."""
    value = (os.environ if environ is None else environ).get(LEARNED_HINTS_ENV, "").strip().lower()
    if value in _ON:
        return TrafficLearner()
    if value in _OFF:
        return None
    raise ValueError(f"{LEARNED_HINTS_ENV} must be on or off, got {value!r}")


def learner_stats(learner: TrafficLearner | None) -> dict[str, Any]:
    """The ``learner`` part of ``/kvflow/v1/stats`` (and of ``/metrics``, as ``kvflow_learner_*``)."""
    if learner is None:
        return {"enabled": False}
    return {"enabled": True, **learner.stats()}


def learned_view(learner: TrafficLearner) -> dict[str, Any]:
    """The body of ``GET /kvflow/v1/learned``: learned agents and transitions (no prompts, no session ids)."""
    return {"namespace": learner.config.namespace, "stats": learner.stats(), **learner.graph()}


def reply_of_response(route: str, body: bytes, streamed: bool) -> dict[str, Any] | None:
    """The first choice's reply in an OpenAI response, as an assistant message (``content``,
    ``tool_calls``; a completion's text as ``content``); None when it has none (an error, not JSON).
    ``streamed``: ``body`` is the server-sent events of a streamed answer."""
    if not streamed:
        try:
            answer = json.loads(body)
        except ValueError:
            return None
        choice = _first_choice(answer)
        if choice is None:
            return None
        if route == "chat":
            message = choice.get("message")
            return message if isinstance(message, dict) else None
        return {"content": choice.get("text")} if isinstance(choice.get("text"), str) else None
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for line in body.split(b"\n"):
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        try:
            choice = _first_choice(json.loads(line[5:]))
        except ValueError:
            continue
        if choice is None:
            continue
        delta = choice.get("delta") if route == "chat" else choice
        if not isinstance(delta, dict):
            continue
        piece = delta.get("content") if route == "chat" else delta.get("text")
        if isinstance(piece, str):
            text.append(piece)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_call(calls.setdefault(call.get("index", len(calls)) if isinstance(call.get("index"), int)
                                             else len(calls), {}), call)
    return {"content": "".join(text), "tool_calls": [calls[i] for i in sorted(calls)]}


def _first_choice(answer: Any) -> dict[str, Any] | None:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _merge_call(into: dict[str, Any], delta: dict[str, Any]) -> None:
    """A streamed tool call arrives in pieces: the id and name once, the arguments in parts."""
    if isinstance(delta.get("id"), str):
        into["id"] = delta["id"]
    fn = delta.get("function") if isinstance(delta.get("function"), dict) else {}
    target = into.setdefault("function", {"name": "", "arguments": ""})
    if isinstance(fn.get("name"), str):
        target["name"] += fn["name"]
    if isinstance(fn.get("arguments"), str):
        target["arguments"] += fn["arguments"]
