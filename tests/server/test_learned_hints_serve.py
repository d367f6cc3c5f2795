"""``kvflow serve`` learns hints from plain OpenAI traffic: a supervisor loop driven by the OpenAI SDK
with no hints and no session keys gets learned hints on every request (the engine's intake counts
them as hinted), the learner's counts show in /kvflow/v1/stats and /metrics, ``kvflow graph
--server`` prints what was learned, and greedy outputs equal those of ``--no-learned-hints``."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest
from process_tree import wait_healthy

openai = pytest.importorskip("openai")

SUPERVISOR = "You are the Supervisor. Today is 2025-05-0{day}. Pick the next worker or finish."
RESEARCHER = "You are a Research Analyst. Find facts."
WRITER = "You are a Technical Writer. Write the report."
SESSIONS = 3
PER_SESSION = 5  # supervisor, researcher, supervisor, writer, supervisor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def kvflow_serve(*flags: str) -> Iterator[str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", "tiny-random", "--device-tokens", "2048",
           "--host-tokens", "4096", "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 120, "kvflow serve")
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def supervisor_loop(url: str) -> list[str]:
    """Interleaved sessions, as concurrent users send them; every reply is echoed back."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    conversations = [[{"role": "user", "content": f"Session {s}: report on topic number {s} please"}]
                     for s in range(SESSIONS)]
    order = [(SUPERVISOR, None), (RESEARCHER, "researcher"), (SUPERVISOR, None), (WRITER, "writer"), (SUPERVISOR, None)]
    replies = []
    for system, _ in order:
        for s, turns in enumerate(conversations):
            prompt = system.format(day=s + 1)
            reply = client.chat.completions.create(model="tiny-random", temperature=0, max_tokens=8,
                                                   messages=[{"role": "system", "content": prompt}, *turns])
            text = reply.choices[0].message.content or ""
            turns.append({"role": "assistant", "content": text})
            replies.append(text)
    return replies


def test_kvflow_serve_learns_hints_from_plain_traffic_without_changing_outputs() -> None:
    with kvflow_serve("--learned-hints") as url:
        learned_replies = supervisor_loop(url)
        stats = httpx.get(f"{url}/kvflow/v1/stats").json()
        metrics = httpx.get(f"{url}/metrics").text
        graph = subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "graph", "--server", url],
                               capture_output=True, text=True, timeout=60)
        mermaid = subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "graph", "--server", url, "--mermaid"],
                                 capture_output=True, text=True, timeout=60)
    learner = stats["learner"]
    total = SESSIONS * PER_SESSION
    assert learner["enabled"] is True
    assert (learner["learned_hint_requests"], learner["declared_hint_requests"], learner["unhinted_requests"]) == (
        total, 0, 0)
    assert learner["learned_agents"] == 3 and learner["live_sessions"] == SESSIONS
    assert stats["hinted_requests"] == total  # the engine's intake received every learned hint
    assert f"kvflow_learner_learned_hint_requests {float(total)}" in metrics
    assert f"kvflow_learner_live_sessions {float(SESSIONS)}" in metrics
    assert graph.returncode == 0, graph.stderr
    assert "supervisor -> research-analyst" in graph.stdout and "research-analyst -> supervisor" in graph.stdout
    assert "supervisor -> technical-writer" in graph.stdout
    assert mermaid.returncode == 0 and mermaid.stdout.startswith("flowchart LR")
    assert '["research-analyst"]' in mermaid.stdout and "-->|" in mermaid.stdout

    with kvflow_serve("--no-learned-hints") as url:
        plain_replies = supervisor_loop(url)
        stats = httpx.get(f"{url}/kvflow/v1/stats").json()
        off = httpx.get(f"{url}/kvflow/v1/learned")
        graph_off = subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "graph", "--server", url],
                                   capture_output=True, text=True, timeout=60)
    assert stats["learner"] == {"enabled": False} and stats["hinted_requests"] == 0
    assert off.status_code == 404 and off.json()["error"]["code"] == "learner_off"
    assert graph_off.returncode == 1 and "learner is off" in graph_off.stderr
    assert learned_replies == plain_replies  # greedy outputs do not depend on learned hints
    assert any(learned_replies)


def test_graph_needs_exactly_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    from kvflow_orch import cli

    assert cli.main(["graph"]) == 2
    assert cli.main(["graph", "workflows.metagpt:workflow", "--server", "http://127.0.0.1:9"]) == 2
    assert "one of them" in capsys.readouterr().err
    assert cli.main(["graph", "--server", f"http://127.0.0.1:{_free_port()}"]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_learned_hints_reach_the_plugin_hosts_through_their_launch_plans(capsys: pytest.CaptureFixture[str]) -> None:
    """The vLLM and SGLang plugins run the learner themselves (tests/frameworks/test_frameworks_vllm.py,
    tests/sglang/test_learned_hints.py): the switch travels as KVFLOW_LEARNED_HINTS."""
    import argparse

    from backends.sglang_kvflow.launcher import plan_from_args as sglang_plan
    from backends.vllm_kvflow.launcher import plan_from_args as vllm_plan
    from kvflow_orch import cli

    for plan in (vllm_plan, sglang_plan):
        assert plan(argparse.Namespace(model="/m", learned_hints=True), []).env["KVFLOW_LEARNED_HINTS"] == "on"
        assert plan(argparse.Namespace(model="/m", learned_hints=False), []).env["KVFLOW_LEARNED_HINTS"] == "off"
    # SGLang's plugin (which applies hints) is off with any other policy: refused, naming the fix
    argv = ["serve", "--engine", "sglang", "--policy", "lru", "--model", "tiny-random", "--learned-hints"]
    assert cli.main(argv) == 2
    assert "--policy kvflow" in capsys.readouterr().err
