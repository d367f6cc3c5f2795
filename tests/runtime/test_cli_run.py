"""``kvflow run`` through the real console entry point: state on stdout, progress on stderr, the
--record JSONL round-trips through kvflow_orch.protocol.trace, and bad arguments exit 2 with a message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kvflow_orch.protocol import FORMAT_VERSION, read_calls

FLOW = textwrap.dedent(
    """
    from kvflow_orch import Workflow, START, END
    workflow = Workflow("cli-flow")
    workflow.add_agent("writer", system="You write.", prompt="Topic: {topic}", output="draft")
    workflow.add_agent("editor", system="You edit.", prompt="Edit: {draft}", output="final")
    workflow.add_edge(START, "writer")
    workflow.add_edge("writer", "editor")

    from typing import TypedDict
    from langgraph.graph import StateGraph

    class S(TypedDict):
        x: int

    _g = StateGraph(S)
    _g.add_node("a", lambda s: {"x": 1})
    _g.add_edge(START, "a")
    langgraph_app = _g.compile()

    def broken():
        wf = Workflow("broken")
        wf.add_node("boom", lambda s: 1 / 0)
        wf.add_edge(START, "boom")
        return wf
    """
)


def kvflow(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    (tmp_path / "cli_flow.py").write_text(FLOW)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "kvflow_orch.cli", "run", *argv],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )


def test_run_prints_state_and_records_calls(tmp_path, server):
    record = tmp_path / "trace.jsonl"
    proc = kvflow(tmp_path, "cli_flow:workflow", "--input", '{"topic": "kv cache"}', "--backend", server.url,
                  "--record", str(record), "--workflow-id", "cli-1", "--namespace", "docs")
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert state == {"topic": "kv cache", "draft": "reply to 3 words", "final": "reply to 5 words"}
    assert "writer started" in proc.stderr and "editor done" in proc.stderr
    calls = list(read_calls(record))
    assert [(c.node, c.agent, c.workflow_id, c.namespace) for c in calls] == [
        ("writer", "writer", "cli-1", "docs"), ("editor", "editor", "cli-1", "docs")]
    assert calls[0].hint["steps"] == {"writer": 0, "editor": 1}
    assert calls[1].hint["steps"] == {"writer": None, "editor": 0}
    assert calls[0].prompt_tokens == 5 and calls[0].cached_tokens == 3 and calls[0].completion_tokens == 4
    assert calls[0].offset_s <= calls[1].offset_s
    first = json.loads(record.read_text().splitlines()[0])
    assert first["v"] == FORMAT_VERSION and set(first) >= {"time", "hint", "prompt_tokens", "cached_tokens"}


@pytest.mark.parametrize("line, message", [
    ('"just a string"', "expected a JSON object, got str"),
    ("{not json", "Expecting property name"),
    ('{"v": 99}', "trace record version 99 is not supported"),
])
def test_a_bad_record_line_is_a_value_error_naming_it(tmp_path, line, message):
    record = tmp_path / "trace.jsonl"
    record.write_text("\n" + line + "\n")
    with pytest.raises(ValueError, match=f"trace.jsonl:2: not a kvflow call record: {message}"):
        list(read_calls(record))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["cli_flow:workflow", "--input", "{not json"], "--input is not valid JSON"),
        (["cli_flow:workflow", "--input", "[1, 2]"], "must be a JSON object"),
        (["cli_flow:workflow", "--input", "@missing.json"], "cannot read --input file"),
        (["cli_flow:nothing"], "has no attribute 'nothing'"),
        (["cli_flow:workflow", "--backend", "carrier-pigeon"], "backend 'carrier-pigeon' not understood"),
        (["cli_flow:langgraph_app"], "is a LangGraph graph; run it with its own invoke()"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, argv, message):
    proc = kvflow(tmp_path, *argv)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""


def test_failing_workflow_exits_1_naming_the_node(tmp_path, server):
    proc = kvflow(tmp_path, "cli_flow:broken", "--backend", server.url, "--quiet")
    assert proc.returncode == 1
    assert "node 'boom' raised ZeroDivisionError" in proc.stderr
    assert proc.stderr.count("\n") == 1  # one clear line, no traceback


def test_input_from_file(tmp_path, server):
    (tmp_path / "in.json").write_text('{"topic": "x y"}')
    proc = kvflow(tmp_path, "cli_flow:workflow", "--input", "@in.json", "--backend", server.url, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["draft"] == "reply to 3 words"
