"""What a server answered an agent framework's app, request by request, and how much of each repeat
call of an agent it found cached before the call's new turns (issue 24's "tools cached" measure).

:func:`recording_proxy` sits between the app and the server and records every generation request's
body and the usage its reply reported (``prompt_tokens``, ``cached_tokens``; streamed replies too).
:func:`repeat_calls` reads the records: an agent is the route plus its system prompt and its tools
(a tool set that changes, as CrewAI's manager's does per task, is another agent's); a call is a
*repeat call* when that agent called before, and its *new turns* are the messages after the longest
run of messages it shares with the agent's previous call. Per call:

* ``before`` = ``prompt_tokens`` minus the tokens of the new turns and the generation prompt (what
  the agent had already sent: system prompt, tools, earlier turns, and any per-call text the server
  adds);
* ``cached_before`` = ``min(cached_tokens, new_turns_start)``, ``new_turns_start`` being the token
  position of the first new turn in the prompt as the running code renders it (checked against the
  server's ``prompt_tokens``): cached text after it (a shared start of the new turn) does not count,
  and per-call text the server puts after the conversation is never counted cached.

The analysis renders prompts with the imported ``backends.server``: run it under the code that
served the records.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.server import openai_models as api
from backends.server import responses_models as rm
from backends.server import tool_calls
from framework_runs import app_on_loopback

__all__ = ["recording_proxy", "repeat_calls", "cached_share"]


def _usage(path: str, body: dict[str, Any], text: str) -> tuple[int, int] | None:
    """``(prompt_tokens, cached_tokens)`` from a reply, whole or streamed (SSE)."""
    replies = [json.loads(line[6:]) for line in text.splitlines()
               if line.startswith("data: ") and line[6:].startswith("{")] if body.get("stream") else [json.loads(text)]
    for reply in reversed(replies):
        usage = (reply.get("response") or {}).get("usage") if "response" in reply else reply.get("usage")
        if not usage:
            continue
        if path.endswith("/responses"):
            return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
    return None


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A proxy on 127.0.0.1 that forwards every request to ``upstream`` (replies buffered whole)
    and records each generation request's body and the usage its reply reported."""
    records: list[dict[str, Any]] = []
    client = httpx.AsyncClient(base_url=upstream, timeout=600)

    async def forward(request: Request) -> Response:
        raw = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        reply = await client.request(request.method, request.url.path, params=request.query_params, content=raw,
                                     headers=headers)
        path = request.url.path
        if request.method == "POST" and path in ("/v1/chat/completions", "/v1/responses") and reply.status_code == 200:
            body = json.loads(raw)
            records.append({"path": path, "body": body, "usage": _usage(path, body, reply.text)})
        keep = {k: v for k, v in reply.headers.items() if k.lower() in ("content-type",)}
        return Response(reply.content, status_code=reply.status_code, headers=keep)

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "HEAD"])])
    with app_on_loopback(app) as url:
        yield url, records


# ---- what a call shares with its agent's previous one -----------------------------------
def _conversation(path: str, body: dict[str, Any]) -> tuple[list[api.ChatMessage], Any]:
    if path.endswith("/responses"):
        request = rm.ResponsesRequest.model_validate(body)
        return rm.conversation(request), rm.plan_response(request)
    request = api.ChatCompletionRequest.model_validate(body)
    return request.messages, tool_calls.plan_chat(request)


def _rendered(history: list[api.ChatMessage], plan: Any) -> list[dict[str, str]]:
    rendered = tool_calls.render_messages(history, plan)
    return rendered.messages if hasattr(rendered, "messages") else rendered  # the base commit returns the list


def _agent(path: str, body: dict[str, Any], messages: list[api.ChatMessage]) -> str:
    system = messages[0].text() if messages and messages[0].role in ("system", "developer") else ""
    return json.dumps([path, system, body.get("tools") or []], sort_keys=True)


def repeat_calls(records: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """Every repeat call with usage: ``before``, ``cached_before`` (see the module docstring) and
    whether its new turns start with a user message."""
    previous: dict[str, list[dict[str, str]]] = {}
    calls = []
    for record in records:
        history, plan = _conversation(record["path"], record["body"])
        plain = _rendered(history, tool_calls.ChatPlan())  # the client's turns, no tools text
        agent = _agent(record["path"], record["body"], history)
        last, previous[agent] = previous.get(agent), plain
        if last is None or record["usage"] is None:
            continue
        shared = 0
        while shared < min(len(last), len(plain)) and last[shared] == plain[shared]:
            shared += 1
        if shared == len(plain):
            continue  # the same conversation again (a framework's retry, or its streamed twin)
        prompt_tokens, cached = record["usage"]
        rendered = _rendered(history, plan)
        if len(tokenizer.encode_chat(rendered).input_ids) != prompt_tokens:
            raise SystemExit(f"the prompt rendered here is not the one the server counted ({prompt_tokens} tokens)")
        # the rendered messages are the client's, maybe after a tools message of their own (and
        # before a trailing one): the new turns start `lead` messages further on
        lead = 1 if rendered[1:len(plain) + 1] == plain else 0
        new_start = len(tokenizer.encode(tokenizer.render_chat(rendered[:shared + lead], add_generation_prompt=False)))
        new_tokens = len(tokenizer.encode(tokenizer.render_chat(plain[shared:], add_generation_prompt=True)))
        before = prompt_tokens - new_tokens
        calls.append({"agent": agent, "before": before, "cached_before": min(cached, new_start),
                      "new_turns_start": new_start, "prompt_tokens": prompt_tokens, "cached_tokens": cached,
                      "new_user_turn": plain[shared]["role"] == "user"})
    return calls


def cached_share(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The calls' ``cached_before`` over their ``before``, summed."""
    before = sum(c["before"] for c in calls)
    cached = sum(c["cached_before"] for c in calls)
    return {"calls": len(calls), "before": before, "cached_before": cached,
            "ratio": round(cached / before, 4) if before else None}
