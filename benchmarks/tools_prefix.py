"""How much of a tool-using agent's repeat call the server finds cached before the call's new turns
(issue 24, point 1: "Tools cached", target >= 90%), for unmodified framework apps, old code beside new.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/tools_prefix.py --before-root /tmp/i24-base \\
        [--apps openai_agents_chat,openai_agents_responses,crewai] [--sessions 3] [--model tiny-random] [--out DIR]

For each code root (``--before-root``: a checkout of the base commit; ``--after-root``: this one) and
each app, the script starts ``kvflow serve`` from that root, puts a recording proxy in front of it,
runs the app (``tests/frameworks/apps``, in its framework venv) through the proxy, and reads what
the server itself answered: every reply's ``prompt_tokens`` and ``cached_tokens`` (streamed replies
included). An agent is the route plus its system prompt and its tool names; a call is a *repeat
call* when that agent called before, and its *new turns* are the messages after the longest run of
messages it shares with the agent's previous call. Then, per call:

* ``before`` = ``prompt_tokens`` minus the tokens of the new turns and the generation prompt (what
  the agent had already sent: system prompt, tools, earlier turns, and any per-call text the server
  adds; the same rendering of new turns for both roots, so the denominators agree);
* ``cached_before`` = ``min(cached_tokens, new_turns_start)``, where ``new_turns_start`` is the
  token position of the first new turn in the prompt as that root's code renders it (checked
  against the server's ``prompt_tokens``): cached text after it (a shared start of the new turn)
  does not count, and per-call text the server puts after the conversation can never be counted
  cached (the base commit's tool block, this one's ``tool_choice`` note).

It prints, per app, the sum of ``cached_before`` over the sum of ``before`` for repeat calls whose
new turns start with a user message (the target's case) and for all repeat calls, before and after,
and writes ``tools_prefix.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))
from framework_runs import free_port, run_app, venv_python  # noqa: E402

from backends.server import openai_models as api  # noqa: E402
from backends.server import responses_models as rm  # noqa: E402
from backends.server import tool_calls  # noqa: E402

APPS = {  # name -> (app script, venv, arguments)
    "openai_agents_chat": ("openai_agents_app", "frameworks", ("--api", "chat")),
    "openai_agents_responses": ("openai_agents_app", "frameworks", ("--api", "responses")),
    "crewai": ("crewai_app", "crewai", ("--process", "hierarchical")),
}


# ---- the recording proxy ----------------------------------------------------------------
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
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.05)
    try:
        yield f"http://127.0.0.1:{port}", records
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# ---- what a call shares with its agent's previous one -----------------------------------
# Run under the measured root's code (``--analyse``): the prompt is rendered as that code renders it.
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
    tools = sorted((t.get("function") or t).get("name", "") for t in body.get("tools") or [])
    return json.dumps([path, system, tools])


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


def _ratio(calls: list[dict[str, Any]]) -> dict[str, Any]:
    before = sum(c["before"] for c in calls)
    cached = sum(c["cached_before"] for c in calls)
    return {"calls": len(calls), "before": before, "cached_before": cached,
            "ratio": round(cached / before, 4) if before else None}


# ---- one run ----------------------------------------------------------------------------
def measure(root: Path, app: str, model: str, sessions: int, log: Path) -> dict[str, Any]:
    """Serve from ``root``, run ``app`` through the proxy, and summarise its repeat calls."""
    from backends.vllm_kvflow.launcher import running

    script, venv, args = APPS[app]
    python = venv_python(venv)
    if python is None:
        raise SystemExit(f"the {venv} venv is not built (bash .ci/setup-frameworks builds it)")
    port = free_port()
    argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--port", str(port), "--model", model,
            "--device-tokens", "65536", "--host-tokens", "0"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=root, timeout_s=600) as url:
        with recording_proxy(url) as (proxy, records):
            run_app(python, script, proxy + "/v1", *args, "--sessions", str(sessions), timeout_s=3600)
    saved = log.with_suffix(".records.json")
    saved.write_text(json.dumps(records))
    analysed = subprocess.run([sys.executable, __file__, "--analyse", str(saved), "--model", model], env=env,
                              capture_output=True, text=True)
    if analysed.returncode != 0:
        raise SystemExit(f"analysing {saved} under {root} failed:\n{analysed.stderr[-4000:]}")
    calls = json.loads(analysed.stdout)
    return {"requests": len(records), "new_user_turn": _ratio([c for c in calls if c["new_user_turn"]]),
            "all_repeat": _ratio(calls), "calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--before-root", type=Path, help="a checkout of the base commit (required)")
    parser.add_argument("--after-root", type=Path, default=ROOT)
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--out", type=Path, default=None, help="write tools_prefix.json here")
    parser.add_argument("--analyse", type=Path, default=None, help=argparse.SUPPRESS)  # the per-root step
    args = parser.parse_args()
    if args.analyse is not None:
        from backends.local.model.loader import read_source  # the served model's tokenizer

        print(json.dumps(repeat_calls(json.loads(args.analyse.read_text()), read_source(args.model)[2])))
        return
    if args.before_root is None:
        parser.error("--before-root is required")
    print(f"load: {os.getloadavg()}  model: {args.model}  sessions: {args.sessions}", flush=True)
    results: dict[str, Any] = {"model": args.model, "sessions": args.sessions, "apps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for app in args.apps.split(","):
            results["apps"][app] = {}
            for label, root in (("before", args.before_root), ("after", args.after_root)):
                commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
                run = measure(root.resolve(), app, args.model, args.sessions, Path(tmp) / f"{app}-{label}.log")
                results["apps"][app][label] = {"root": str(root), "commit": commit, **run}
                turn, every = run["new_user_turn"], run["all_repeat"]
                print(f"{app:26s} {label:6s} ({commit}): repeat calls with a new user turn cache "
                      f"{turn['cached_before']}/{turn['before']} = {turn['ratio']} of the tokens before it "
                      f"({turn['calls']} calls); all repeat calls {every['cached_before']}/{every['before']} = "
                      f"{every['ratio']} ({every['calls']} calls; {run['requests']} requests)", flush=True)
    print(f"load: {os.getloadavg()}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tools_prefix.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
