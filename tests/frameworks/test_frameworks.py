"""Unmodified apps of the major agent frameworks (``apps/``, each in the venv ``.ci/setup-frameworks``
builds) run against a real ``kvflow serve --model tiny-random``. Each must finish, or stop at the
framework's own turn limit, and the server must have answered every one of its requests with a 2xx
(read from the server's ``/metrics``). tiny-random's replies are random text, but every tool call
and structured reply is valid: constrained decoding enforces them, so each framework's parsing and
tool loop run for real."""

from __future__ import annotations

from typing import Iterator

import pytest

from framework_runs import SETUP, answered_since, http_counts, kvflow_serve, run_app, venv_python

pytestmark = pytest.mark.frameworks

# app, venv, extra arguments, the routes its requests must reach
APPS = [
    ("openai_agents_app", "frameworks", ("--api", "responses"), {"/v1/responses"}),
    ("openai_agents_app", "frameworks", ("--api", "chat"), {"/v1/chat/completions"}),
    ("crewai_app", "crewai", ("--process", "both"), {"/v1/chat/completions"}),
    ("autogen_app", "frameworks", (), {"/v1/chat/completions"}),
    ("pydantic_ai_app", "frameworks", (), {"/v1/chat/completions"}),
    ("smolagents_app", "frameworks", (), {"/v1/chat/completions"}),
    ("langgraph_supervisor_app", "frameworks", (), {"/v1/chat/completions"}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("kvflow-serve") / "server.log"
    with kvflow_serve(["--model", "tiny-random", "--device-tokens", "16384", "--host-tokens", "16384"], log) as url:
        yield url


@pytest.mark.parametrize("app,venv,args,routes", APPS, ids=[f"{a[0]}{'-' + a[2][1] if a[2] else ''}" for a in APPS])
def test_app_completes_with_no_error_answer(server: str, app: str, venv: str, args: tuple[str, ...],
                                            routes: set[str]) -> None:
    python = venv_python(venv)
    if python is None:
        pytest.skip(f"the {venv} venv is not built ({SETUP} builds it)")
    before = http_counts(server)
    run = run_app(python, app, server + "/v1", *args)
    answered = answered_since(before, http_counts(server))
    errors = {key: n for key, n in answered.items() if key[2] >= 400}
    assert not errors, f"the server answered {app} with errors {errors}; app output:\n{run.output[-4000:]}"
    reached = {path for (method, path, _) in answered if method == "POST"}
    assert routes <= reached, f"{app} never reached {routes - reached}: {answered}"
    assert run.summary["outcomes"], run.summary


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_repeat_calls_find_their_tools_cached(server: str, api: str) -> None:
    """Issue 24's "tools cached" target on the unmodified triage app (a handoff tool, a function
    tool): a repeat call of an agent with a new user turn finds >= 90% of the tokens before that
    turn cached, by the server's own ``cached_tokens``."""
    from backends.local.model.loader import read_source
    from cache_records import cached_share, recording_proxy, repeat_calls

    python = venv_python("frameworks")
    if python is None:
        pytest.skip(f"the frameworks venv is not built ({SETUP} builds it)")
    with recording_proxy(server) as (proxy, records):
        run_app(python, "openai_agents_app", proxy + "/v1", "--api", api, "--sessions", "2")
    calls = [c for c in repeat_calls(records, read_source("tiny-random")[2]) if c["new_user_turn"]]
    share = cached_share(calls)
    assert share["calls"] >= 2 and share["ratio"] >= 0.9, share
