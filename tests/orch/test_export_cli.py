"""networkx/Mermaid export and the real ``kvflow graph`` console command on a module on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvflow_orch import END, START, Workflow

KVFLOW = Path(sys.executable).with_name("kvflow")

FLOW = textwrap.dedent(
    """
    from kvflow_orch import END, START, Workflow

    def route(state):
        return "ship"

    def build():
        wf = Workflow("demo")
        wf.add_agent("pm", system="PM")
        wf.add_agent("coder_a", system="CODER", agent="coder")
        wf.add_agent("coder_b", system="CODER", agent="coder")
        wf.add_node("merge", lambda s: None)
        wf.add_agent("qa", system="QA")
        wf.add_edge(START, "pm")
        wf.add_edge("pm", "coder_a")
        wf.add_edge("pm", "coder_b")
        wf.add_edge(["coder_a", "coder_b"], "merge")
        wf.add_edge("merge", "qa")
        wf.add_conditional_edges("qa", route, {"fix": "pm", "ship": END})
        return wf

    workflow = build()
    asg = workflow.compile()
    not_a_graph = 42

    def broken():
        wf = Workflow("broken")
        wf.add_node("a", lambda s: None)
        wf.add_edge("a", END)
        return wf
    """
)


def demo() -> Workflow:
    namespace: dict = {}
    exec(FLOW, namespace)
    return namespace["build"]()


def test_to_networkx_carries_kinds_agents_keys_and_joins():
    g = demo().compile().to_networkx()
    assert g.nodes[START]["kind"] == "start" and g.nodes[END]["kind"] == "end"
    assert g.nodes["coder_b"] == {"kind": "agent", "agent": "coder"}
    assert g.nodes["merge"] == {"kind": "function", "agent": None}
    assert g.edges[START, "pm"] == {"kind": "plain"}
    assert g.edges["qa", "pm"] == {"kind": "conditional", "key": "fix"}
    assert g.edges["qa", END] == {"kind": "conditional", "key": "ship"}
    assert g.edges["coder_a", "merge"] == {"kind": "and", "join": 0}
    assert g.number_of_edges() == 8


def test_to_mermaid_lists_every_edge_with_its_arrow():
    text = demo().compile().to_mermaid()
    assert text.startswith("flowchart TD\n")
    assert "-.->|fix|" in text and "-.->|ship| end_node" in text
    assert text.count("==>|AND join 0|") == 2
    assert text.count(" --> ") == 4
    assert "agent: coder" in text


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "flowmod.py").write_text(FLOW)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [str(KVFLOW), "graph", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )


@pytest.mark.parametrize("attr", ["workflow", "asg", "build"])
def test_kvflow_graph_prints_nodes_edges_and_initial_steps(tmp_path, attr):
    done = run_cli(tmp_path, f"flowmod:{attr}")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "workflow 'demo': 5 nodes, 3 agents, 1 AND-joins" in out
    assert "coder_b" in out and "agent=coder" in out and "function" in out
    assert "qa -> pm" in out and "conditional  keys=['fix']" in out
    assert "and  join=0" in out
    steps = out.split("initial steps-to-execution:")[1].split()
    assert dict(zip(steps[::2], steps[1::2], strict=True)) == {"pm": "0", "coder_a": "1", "coder_b": "1", "merge": "2",
                                                               "qa": "3"}


def test_kvflow_graph_mermaid(tmp_path):
    done = run_cli(tmp_path, "flowmod:workflow", "--mermaid")
    assert done.returncode == 0, done.stderr
    assert done.stdout == demo().compile().to_mermaid()


@pytest.mark.parametrize(
    "target, message",
    [
        ("flowmod", "expected MODULE:ATTR"),
        ("no_such_module:x", "cannot import module 'no_such_module'"),
        ("flowmod:missing", "has no attribute 'missing'"),
        ("flowmod:not_a_graph", "is a int; expected a Workflow"),
    ],
)
def test_kvflow_graph_bad_target_exits_2_with_message(tmp_path, target, message):
    done = run_cli(tmp_path, target)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_kvflow_graph_invalid_workflow_exits_1_naming_the_problem(tmp_path):
    done = run_cli(tmp_path, "flowmod:broken")
    assert done.returncode == 1
    assert "no edge from START" in done.stderr and "Traceback" not in done.stderr
