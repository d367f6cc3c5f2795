"""What the learner reads of a plain OpenAI request: its leading part, its conversation, its session key.

Reading never fails: a field of an unexpected shape reads as absent (JSON objects are ``dict``)
(the host validated the body already; the vLLM and SGLang hosts hand over the raw JSON), and a
session key that is not a string or a number is reported as bad instead.

**Session keys**, first found wins (a key names one session; the content is not read then):

1. body ``prompt_cache_key`` (OpenAI);
2. body ``metadata.session_id``, ``metadata.conversation_id``, ``metadata.thread_id`` (OpenAI's
   ``metadata`` map; LangGraph and LangSmith call a conversation a thread);
3. headers ``x-session-id``, ``x-conversation-id``, ``x-thread-id``;
4. body ``safety_identifier``, then ``user`` (OpenAI's end-user ids: one user's requests are one
   session until it expires).

Keys are hashed at once: a key of any length costs the same 16 bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, NamedTuple, Sequence

__all__ = ["RequestView", "read_chat", "read_completion", "digest", "turn_of", "SESSION_KEY_FIELDS",
           "SESSION_KEY_HEADERS"]

SESSION_KEY_FIELDS = ("prompt_cache_key", "metadata.session_id", "metadata.conversation_id", "metadata.thread_id")
SESSION_KEY_HEADERS = ("x-session-id", "x-conversation-id", "x-thread-id")
USER_KEY_FIELDS = ("safety_identifier", "user")
LEADING_ROLES = ("system", "developer")


class RequestView(NamedTuple):
    model: str
    lead: str
    """The candidate stable leading text: the leading system/developer messages (chat), the prompt
    (completions)."""
    tools: bytes
    """Digest of the tools' names and schemas (and the route), part of the agent's identity."""
    turns: tuple[str, ...]
    """Canonical forms of the messages after the leading ones (chat); empty for completions."""
    texts: tuple[str, ...]
    """Texts where an earlier reply may be carried: every message after the lead, or the prompt."""
    call_ids: tuple[str, ...]
    """Ids of the tool calls its messages echo (assistant ``tool_calls``, tool ``tool_call_id``)."""
    session_key: bytes | None
    bad_key: bool
    """A session key field was present but of a type that cannot name a session."""


def digest(*parts: str | bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def read_chat(body: Mapping[str, Any], headers: Mapping[str, str] = {}) -> RequestView:
    messages = [m for m in _list(body.get("messages")) if isinstance(m, dict)]
    lead_count = 0
    while lead_count < len(messages) and messages[lead_count].get("role") in LEADING_ROLES:
        lead_count += 1
    lead = "\n\n".join(content_text(m.get("content")) for m in messages[:lead_count])
    rest = messages[lead_count:]
    key, bad = session_key(body, headers)
    call_ids = [str(c.get("id")) for m in rest for c in _list(m.get("tool_calls"))
                if isinstance(c, dict) and c.get("id")]
    call_ids += [str(m["tool_call_id"]) for m in rest if m.get("tool_call_id")]
    return RequestView(_model(body), lead, digest("chat", _tools_digest(body.get("tools"))),
                       tuple(turn_of(m) for m in rest), tuple(content_text(m.get("content")) for m in rest),
                       tuple(dict.fromkeys(call_ids)), key, bad)


def read_completion(body: Mapping[str, Any], headers: Mapping[str, str] = {}) -> RequestView:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt = prompt[0]  # a batch of prompts: the first names the agent
    if isinstance(prompt, list):
        prompt = " ".join(str(t) for t in prompt if isinstance(t, int))  # token ids keep their order
    text = prompt if isinstance(prompt, str) else ""
    key, bad = session_key(body, headers)
    return RequestView(_model(body), text, digest("completions"), (), (text,), (), key, bad)


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[bytes | None, bool]:
    """The first session key present (module docstring), hashed; ``bad``: one was of the wrong type.
    ``headers`` names are lower case (a Starlette ``Headers`` matches any case)."""
    bad = False
    for field in SESSION_KEY_FIELDS:
        key, wrong = _key(field, _field(body, field))
        if key is not None:
            return key, bad
        bad |= wrong
    for name in SESSION_KEY_HEADERS:
        value = headers.get(name)
        if isinstance(value, str) and value:
            return digest(name, value), bad
    for field in USER_KEY_FIELDS:
        key, wrong = _key(field, body.get(field))
        if key is not None:
            return key, bad
        bad |= wrong
    return None, bad


def _field(body: Mapping[str, Any], path: str) -> Any:
    node: Any = body
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _key(field: str, value: Any) -> tuple[bytes | None, bool]:
    if value is None or value == "":
        return None, False
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None, True
    return digest(field.split(".")[-1], str(value)), False


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def turn_of(message: Mapping[str, Any]) -> str:
    """A canonical form of a conversation message: what a client echoes of an earlier turn compares
    equal (``content`` None and "" alike; tool calls by id, name and arguments)."""
    calls = []
    for call in _list(message.get("tool_calls")):
        if isinstance(call, dict):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            calls.append([str(call.get("id", "")), str(fn.get("name", "")), str(fn.get("arguments", ""))])
    fields = [str(message.get("role", "")), str(message.get("name") or ""), content_text(message.get("content")),
              calls, str(message.get("tool_call_id") or "")]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def _tools_digest(tools: Any) -> bytes:
    """Tools' names and parameter schemas, in the order sent (descriptions are prose; they may vary)."""
    described = []
    for tool in _list(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict):
            described.append([str(fn.get("name", "")), fn.get("parameters")])
    return digest(json.dumps(described, sort_keys=True, default=str, separators=(",", ":")))


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    return model if isinstance(model, str) else ""


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else ()
