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
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = ["RequestView", "NO_TOOLS", "read_chat", "read_completion", "digest", "turn_key", "session_headers",
           "SESSION_KEY_FIELDS", "SESSION_KEY_HEADERS"]

SESSION_KEY_FIELDS = ("prompt_cache_key", "metadata.session_id", "metadata.conversation_id", "metadata.thread_id")
SESSION_KEY_HEADERS = ("x-session-id", "x-conversation-id", "x-thread-id")
USER_KEY_FIELDS = ("safety_identifier", "user")
LEADING_ROLES = ("system", "developer")
_KEY_PATHS = tuple((field, tuple(field.split("."))) for field in SESSION_KEY_FIELDS)
_HEADER_BYTES = frozenset(name.encode() for name in SESSION_KEY_HEADERS)


class RequestView:
    """What the learner reads of one request. Reading is lazy past the lead: a request carries its
    whole conversation, but linking it to a session needs only its first turn and its last few (the
    learner's cost must not grow with the conversation)."""

    __slots__ = ("model", "lead", "tools", "messages", "completion", "session_key", "bad_key", "_turns")

    def __init__(self, model: str, lead: str, tools: int, messages: Sequence[Mapping[str, Any]],
                 completion: str | None, session_key: bytes | None, bad_key: bool) -> None:
        self.model = model
        self.lead = lead
        """The candidate stable leading text: the leading system/developer messages (chat), the
        prompt (completions)."""
        self.tools = tools
        """Key of the route and the tools' names and schema shapes, part of the agent's identity."""
        self.messages = messages
        """The messages after the leading ones (chat), as sent (an entry may be no message); empty
        for completions."""
        self.completion = completion
        """A completion's prompt (where an earlier reply may be carried); None for chat."""
        self.session_key = session_key
        self.bad_key = bad_key
        """A session key field was present but of a type that cannot name a session."""
        self._turns: dict[int, int] = {}

    def turn(self, i: int) -> int:
        """The key of message ``i`` after the lead (:func:`turn_key`), computed once."""
        key = self._turns.get(i)
        if key is None:
            message = self.messages[i]
            key = self._turns[i] = turn_key(message if isinstance(message, dict) else _EMPTY)
        return key

    def texts(self) -> Iterator[str]:
        """Texts where an earlier reply may be carried, the latest first: the messages after the
        lead, or the prompt."""
        if self.completion is not None:
            yield self.completion
        for m in reversed(self.messages):
            if isinstance(m, dict):
                yield content_text(m.get("content"))

    def call_ids(self, last: int) -> list[str]:
        """Ids of the tool calls the last ``last`` messages echo (assistant ``tool_calls``, tool
        ``tool_call_id``), the latest first."""
        ids: dict[str, None] = {}
        for m in reversed(self.messages[-last:]):
            if not isinstance(m, dict):
                continue
            if m.get("tool_call_id"):
                ids[str(m["tool_call_id"])] = None
            for c in _list(m.get("tool_calls")):
                if isinstance(c, dict) and c.get("id"):
                    ids[str(c["id"])] = None
        return list(ids)


def digest(*parts: str | bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def read_chat(body: Mapping[str, Any], headers: Mapping[str, str] = {}) -> RequestView:
    # not filtered for shape: a request carries its whole conversation, and only its lead and its
    # last turns are read (each checked there); an entry that is no message reads as an empty turn
    messages = _list(body.get("messages"))
    lead_count = 0
    while lead_count < len(messages) and isinstance(messages[lead_count], dict) \
            and messages[lead_count].get("role") in LEADING_ROLES:
        lead_count += 1
    lead = "\n\n".join(content_text(m.get("content")) for m in messages[:lead_count])
    key, bad = session_key(body, headers)
    return RequestView(_model(body), lead, _tools_key(body.get("tools")), messages[lead_count:], None, key, bad)


def read_completion(body: Mapping[str, Any], headers: Mapping[str, str] = {}) -> RequestView:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt = prompt[0]  # a batch of prompts: the first names the agent
    if isinstance(prompt, list):
        prompt = " ".join(str(t) for t in prompt if isinstance(t, int))  # token ids keep their order
    text = prompt if isinstance(prompt, str) else ""
    key, bad = session_key(body, headers)
    return RequestView(_model(body), text, hash(("completions", ())), (), text, key, bad)


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[bytes | None, bool]:
    """The first session key present (module docstring), hashed; ``bad``: one was of the wrong type.
    ``headers`` names are lower case (a Starlette ``Headers`` matches any case; a host passes
    :func:`session_headers` where it has the raw pairs: a lookup that misses costs less in a dict)."""
    bad = False
    for field, path in _KEY_PATHS:
        key, wrong = _key(field, body.get(path[0]) if len(path) == 1 else _field(body, path))
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


def session_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The session-key headers among a request's raw ASGI header pairs (names lower case, as ASGI
    servers give them; any case is matched)."""
    out = {}
    for name, value in raw:
        if name in _HEADER_BYTES or (name[:2].lower() == b"x-" and name.lower() in _HEADER_BYTES):
            out.setdefault(name.lower().decode("latin-1"), value.decode("latin-1"))
    return out


def _field(body: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = body
    for part in path:
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


def turn_key(message: Mapping[str, Any]) -> int:
    """A key of a conversation message: what a client echoes of an earlier turn gets the same key
    (``content`` None and "" alike; tool calls by id, name and arguments). Python's string hash,
    keyed per process (SipHash), so that clients cannot aim collisions at it: the index it keys
    lives in this process only, and a collision would only link two sessions."""
    calls = []
    for call in _list(message.get("tool_calls")):
        if isinstance(call, dict):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            calls.append((str(call.get("id", "")), str(fn.get("name", "")), str(fn.get("arguments", ""))))
    return hash((str(message.get("role", "")), str(message.get("name") or ""), content_text(message.get("content")),
                 tuple(calls), str(message.get("tool_call_id") or "")))


def _tools_key(tools: Any) -> int:
    """The route and the tools: each tool's name and the shape of its parameters (the top-level
    property names and types, and which are required), in the order sent. Descriptions are prose
    and may vary; a full serialisation of the schemas would cost more than the rest of a request's
    learning, and tool sets that share names and property names are told apart by their agents'
    prompts anyway. Tools as OpenAI defines them (names and types strings) take a fast path that
    gives the same key; any other shape is read field by field. A tool set always takes the same
    path, so its key is stable either way."""
    if not tools:
        return NO_TOOLS
    try:
        return hash(("chat", tuple([_shape(tool["function"]) for tool in tools])))
    except (TypeError, KeyError, AttributeError):
        pass
    shapes = []
    for tool in _list(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict):
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            props = props if isinstance(props, dict) else {}
            required = params.get("required") if isinstance(params, dict) else None
            shapes.append((str(fn.get("name", "")), tuple((str(k), str(v.get("type")) if isinstance(v, dict) else "")
                                                          for k, v in props.items()),
                           tuple(str(r) for r in _list(required))))
    return hash(("chat", tuple(shapes)))


def _shape(fn: dict[str, Any]) -> tuple[Any, tuple[tuple[str, Any], ...], tuple[Any, ...]]:
    """:func:`_tools_key`'s fast path for one tool: raises where a field is missing, not a map, or unhashable."""
    params = fn.get("parameters") or _EMPTY
    props = params.get("properties") or _EMPTY
    required = params.get("required") or ()
    return (fn["name"], tuple(zip(props, [v["type"] for v in props.values()], strict=True)),
            tuple(required) if type(required) is list else ())


_EMPTY: dict[str, Any] = {}
NO_TOOLS = hash(("chat", ()))
"""The tools key of a chat request that offers no tools."""


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    return model if isinstance(model, str) else ""


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else ()
