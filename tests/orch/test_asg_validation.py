"""compile() rejects every malformed graph with a WorkflowError naming the culprit,
and the ASG read API reports what the builder declared."""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

import pytest

from kvflow_orch import END, START, AgentStepGraph, Workflow, WorkflowError


def fn(state):
    return None


def chain(*names: str, name: str = "wf") -> Workflow:
    """START -> names[0] -> ... -> names[-1] -> END, all plain Python nodes."""
    wf = Workflow(name)
    for n in names:
        wf.add_node(n, fn)
    path = [START, *names, END]
    for u, v in pairwise(path):
        wf.add_edge(u, v)
    return wf


def compile_error(wf: Workflow) -> str:
    with pytest.raises(WorkflowError) as info:
        wf.compile()
    return str(info.value)


def test_valid_chain_compiles_to_asg():
    asg = chain("a", "b").compile()
    assert isinstance(asg, AgentStepGraph)
    assert list(asg.nodes) == ["a", "b"]


@pytest.mark.parametrize(
    "edge, culprit",
    [(("a", "ghost"), "ghost"), (("ghost", "a"), "ghost")],
)
def test_unknown_node_in_plain_edge(edge, culprit):
    wf = chain("a")
    wf.add_edge(*edge)
    msg = compile_error(wf)
    assert culprit in msg and "unknown node" in msg


def test_unknown_node_in_and_edge():
    wf = chain("a", "b")
    wf.add_edge(["a", "ghost"], "b")
    msg = compile_error(wf)
    assert "'ghost'" in msg and "AND edge" in msg


def test_unknown_source_of_conditional_edge():
    wf = chain("a")
    wf.add_conditional_edges("ghost", fn, ["a"])
    assert "'ghost'" in compile_error(wf)


def test_path_map_naming_unknown_node():
    wf = chain("a", "b")
    wf.add_conditional_edges("b", fn, {"retry": "a", "oops": "nowhere"})
    msg = compile_error(wf)
    assert "path_map" in msg and "'nowhere'" in msg and "'b'" in msg


def test_duplicate_node_name():
    wf = chain("a")
    wf.add_node("a", fn)
    msg = compile_error(wf)
    assert "duplicate" in msg and "'a'" in msg


@pytest.mark.parametrize("reserved", [START, END])
def test_reserved_node_names(reserved):
    wf = chain("a")
    wf.add_node(reserved, fn)
    msg = compile_error(wf)
    assert "reserved" in msg and repr(reserved) in msg


def test_start_as_target():
    wf = chain("a")
    wf.add_edge("a", START)
    msg = compile_error(wf)
    assert "START cannot be the target" in msg and "'a'" in msg


def test_start_as_conditional_target():
    wf = chain("a")
    wf.add_conditional_edges("a", fn, [START, END])
    assert "START cannot be the target" in compile_error(wf)


def test_start_as_and_target():
    wf = chain("a", "b")
    wf.add_edge(["a", "b"], START)
    assert "START cannot be the target" in compile_error(wf)


def test_start_as_and_member():
    wf = chain("a", "b")
    wf.add_edge([START, "a"], "b")
    msg = compile_error(wf)
    assert "START cannot be a member" in msg and "'b'" in msg


def test_end_as_source():
    wf = chain("a")
    wf.add_edge(END, "a")
    msg = compile_error(wf)
    assert "END cannot be the source" in msg and "'a'" in msg


def test_end_as_conditional_source():
    wf = chain("a")
    wf.add_conditional_edges(END, fn, ["a"])
    assert "END cannot be the source" in compile_error(wf)


def test_end_as_and_member():
    wf = chain("a", "b")
    wf.add_edge([END, "a"], "b")
    assert "END cannot be the source" in compile_error(wf)


def test_and_edge_listing_a_source_twice():
    wf = chain("a", "b")
    wf.add_edge(["a", "a"], "b")
    assert "twice" in compile_error(wf)


def test_no_edge_from_start():
    wf = Workflow("w")
    wf.add_node("a", fn)
    wf.add_edge("a", END)
    assert "no edge from START" in compile_error(wf)


def test_unreachable_node():
    wf = chain("a")
    wf.add_node("island", fn)
    wf.add_edge("island", "a")
    msg = compile_error(wf)
    assert "'island'" in msg and "unreachable" in msg


def test_and_join_waiting_on_unreachable_member_is_unreachable():
    wf = chain("a")
    wf.add_node("orphan", fn)
    wf.add_node("joined", fn)
    wf.add_edge(["a", "orphan"], "joined")
    msg = compile_error(wf)
    assert "'orphan'" in msg and "'joined'" in msg


def test_one_agent_identity_with_two_system_prompts():
    wf = Workflow("w")
    wf.add_agent("review_1", system="You review code.", agent="reviewer")
    wf.add_agent("review_2", system="You review prose.", agent="reviewer")
    wf.add_edge(START, "review_1")
    wf.add_edge("review_1", "review_2")
    msg = compile_error(wf)
    assert "'reviewer'" in msg and "'review_1'" in msg and "'review_2'" in msg


def test_agent_identity_the_wire_cannot_carry():
    wf = Workflow("long")
    wf.add_agent("writer", system="S.", agent="a" * 257)
    wf.add_edge(START, "writer")
    assert "agent identity of node 'writer' is 257 characters long" in compile_error(wf)
    wf = Workflow("empty")
    wf.add_agent("writer", system="S.", agent="")
    wf.add_edge(START, "writer")
    assert wf.compile().agents == {"writer": ("writer",)}  # empty means the node's own name
    wf = Workflow("crowd")
    for i in range(4097):
        wf.add_agent(f"n{i}", system="S.")
        wf.add_edge(START, f"n{i}")
    assert "4097 agent identities; a hint carries at most 4096" in compile_error(wf)


def test_conditional_edge_without_targets_says_how_to_declare_them():
    wf = chain("a")
    with pytest.raises(WorkflowError, match="Literal"):
        wf.add_conditional_edges("a", lambda s: "a")


def test_literal_annotation_declares_targets():
    def route(state) -> Literal["a", "__end__"]:
        return "a"

    wf = chain("a")
    wf.add_conditional_edges("a", route)
    asg = wf.compile()
    assert asg.branches_of("a")[0].targets == ("a", END)


# --------------------------------------------------------------------- read API
def software_company() -> Workflow:
    wf = Workflow("company", reducers={"log": lambda a, b: a + b})
    wf.add_agent("pm", system="PM prompt", prompt="PRD for {idea}", output="prd")
    wf.add_agent("review_1", system="REVIEWER", agent="reviewer")
    wf.add_agent("review_2", system="REVIEWER", agent="reviewer")
    wf.add_node("tests", fn)
    wf.add_edge(START, "pm")
    wf.add_edge("pm", "review_1")
    wf.add_edge("pm", "review_2")
    wf.add_edge(["review_1", "review_2"], "tests")
    wf.add_conditional_edges("tests", fn, {"again": "pm", "ship": END})
    return wf


def test_read_api_reports_the_declared_graph():
    asg = software_company().compile()
    assert asg.name == "company"
    assert list(asg.nodes) == ["pm", "review_1", "review_2", "tests"]
    assert START not in asg.nodes and END not in asg.nodes
    assert asg.plain_targets(START) == ("pm",)
    assert asg.plain_targets("pm") == ("review_1", "review_2")
    assert asg.plain_targets("tests") == ()
    assert asg.branches_of(START) == ()
    (branch,) = asg.branches_of("tests")
    assert branch.path_map == {"again": "pm", "ship": END}
    assert asg.joins == ((("review_1", "review_2"), "tests"),)
    assert dict(asg.agents) == {"pm": ("pm",), "reviewer": ("review_1", "review_2")}
    assert asg.agent_of("review_2") == "reviewer"
    assert asg.agent_of("tests") is None
    assert asg.agent_of(START) is None
    assert asg.system_prompt("reviewer") == "REVIEWER"
    assert set(asg.reducers) == {"log"}


def test_read_api_rejects_unknown_names():
    asg = software_company().compile()
    with pytest.raises(WorkflowError, match="'ghost'"):
        asg.plain_targets("ghost")
    with pytest.raises(WorkflowError, match="'ghost'"):
        asg.agent_of("ghost")
    with pytest.raises(WorkflowError, match="'tests'"):
        asg.system_prompt("tests")  # a plain Python node has no agent identity


def test_graph_is_immutable_after_compile():
    wf = software_company()
    asg = wf.compile()
    wf.add_node("late", fn)
    assert "late" not in asg.nodes
    with pytest.raises(TypeError):
        asg.nodes["x"] = None  # type: ignore[index]
