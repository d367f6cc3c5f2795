"""A recording proxy for agent-framework traffic, and the recordings it writes.

:func:`truth_proxy` sits on 127.0.0.1 between an app and ``kvflow serve``. An app names the ground
truth of each request in two headers (:func:`traffic_apps.shared.truth`) (set per agent
through its SDK's ``default_headers``); the proxy records the request's exact body with that truth
and **strips the two headers** before forwarding, so the server sees the plain traffic the app would
send without them. Records are kept in arrival order (a request is recorded when it arrives, its
reply filled in when the answer comes back), which is the order a replay sends them in.

Recorded: every generation request (chat, completions, responses) and every out-of-band steps
update (``/kvflow/v1/steps``, what an instrumented LangGraph app sends besides its hints), each as

    {"path", "body", "truth": {"agent", "session"}, "headers": {session-key headers}, "status", "reply"}

``reply`` is the first choice's assistant message as the client saw it (``content``, ``tool_calls``),
read with the learner's own :func:`~backends.learn.host.reply_of_response`. Files are JSON lines.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx

from backends.learn.host import reply_of_response
from backends.learn.requests import session_headers
from traffic_apps.shared import TRUTH_AGENT, TRUTH_SESSION, truth

__all__ = ["TRUTH_AGENT", "TRUTH_SESSION", "truth", "truth_proxy", "write_records", "read_records"]

RECORDED_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
                  "/kvflow/v1/steps": "steps"}
_HOP = {"host", "content-length", "transfer-encoding", "connection", TRUTH_AGENT, TRUTH_SESSION}


@contextmanager
def truth_proxy(upstream: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A proxy on 127.0.0.1 forwarding to ``upstream`` (a server's root URL); yields its root URL
    and the list of records it fills (module docstring). Replies are buffered whole."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from framework_runs import app_on_loopback

    records: list[dict[str, Any]] = []
    client = httpx.AsyncClient(base_url=upstream, timeout=900)

    async def forward(request: Request) -> Response:
        raw = await request.body()
        path = request.url.path
        record = None
        if request.method == "POST" and path in RECORDED_PATHS:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            record = {"path": path, "body": body,
                      "truth": {"agent": request.headers.get(TRUTH_AGENT),
                                "session": request.headers.get(TRUTH_SESSION)},
                      "headers": session_headers((k.encode(), v.encode()) for k, v in request.headers.items()),
                      "status": None, "reply": None}
            records.append(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        reply = await client.request(request.method, path, params=request.query_params, content=raw, headers=headers)
        if record is not None:
            record["status"] = reply.status_code
            route = RECORDED_PATHS[path]
            if reply.status_code == 200 and route in ("chat", "completions"):
                streamed = isinstance(record["body"], dict) and bool(record["body"].get("stream"))
                record["reply"] = reply_of_response(route, reply.content, streamed)
        keep = {k: v for k, v in reply.headers.items() if k.lower() == "content-type"}
        return Response(reply.content, status_code=reply.status_code, headers=keep)

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "HEAD"])])
    with app_on_loopback(app) as url:
        yield url, records


def write_records(path: Path, meta: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """One JSON line of ``meta`` (the app, the command, the model), then one per record."""
    with open(path, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def read_records(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines or "meta" not in lines[0]:
        raise SystemExit(f"{path}: not a recording (its first line must be the meta line)")
    return lines[0]["meta"], lines[1:]
