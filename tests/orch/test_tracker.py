"""StepTracker: the steps-to-execution semantics (kvflow_orch._steps) per edge kind, and its misuse errors."""

from __future__ import annotations

import math

import pytest

from kvflow_orch import END, START, Workflow, WorkflowError

INF = math.inf


def fn(state):
    return None


def build(nodes, edges=(), joins=(), branches=(), agents=None):
    """A workflow of LLM nodes; ``agents`` maps node -> shared identity; branches: (src, targets)."""
    agents = agents or {}
    wf = Workflow("t")
    for n in nodes:
        identity = agents.get(n, n)
        wf.add_agent(n, system=f"system of {identity}", agent=identity)
    for u, v in edges:
        wf.add_edge(u, v)
    for members, v in joins:
        wf.add_edge(list(members), v)
    for src, targets in branches:
        wf.add_conditional_edges(src, fn, list(targets))
    return wf.compile()


def run(tracker, node, goto=None):
    tracker.start(node)
    tracker.finish(node, goto)


def company():
    return build(
        ["pm", "architect", "engineer", "qa"],
        edges=[(START, "pm"), ("pm", "architect"), ("architect", "engineer"), ("engineer", "qa")],
        branches=[("qa", ["engineer", END])],
    )


def test_issue_worked_example():
    t = company().tracker()
    assert t.steps() == {"pm": 0, "architect": 1, "engineer": 2, "qa": 3}
    for node in ("pm", "architect", "engineer"):
        run(t, node)
    t.start("qa")
    assert t.steps() == {"qa": 0, "engineer": 1, "pm": INF, "architect": INF}
    t.finish("qa", goto="engineer")
    assert t.steps() == {"engineer": 0, "qa": 1, "pm": INF, "architect": INF}
    run(t, "engineer")
    t.start("qa")
    t.finish("qa", goto=END)
    assert t.done
    assert t.steps() == dict.fromkeys(["pm", "architect", "engineer", "qa"], INF)


def test_plain_edges_fire_by_themselves_and_fan_out():
    t = build(["a", "b", "c", "d"], edges=[(START, "a"), ("a", "b"), ("a", "c"), ("c", "d")]).tracker()
    run(t, "a")
    assert t.triggered == {"b", "c"}
    assert t.steps() == {"a": INF, "b": 0, "c": 0, "d": 1}


def test_conditional_fan_out_none_and_end():
    asg = build(["r", "x", "y"], edges=[(START, "r")], branches=[("r", ["x", "y", END])])
    t = asg.tracker()
    assert t.steps() == {"r": 0, "x": 1, "y": 1}
    run(t, "r", goto=["x", "y"])
    assert t.triggered == {"x", "y"}
    t2 = asg.tracker()
    run(t2, "r", goto=None)
    assert t2.done
    t3 = asg.tracker()
    run(t3, "r", goto=[])
    assert t3.done
    t4 = asg.tracker()
    run(t4, "r", goto=END)
    assert t4.done


def test_start_with_conditional_edges_counts_as_running():
    asg = build(["a", "b"], branches=[(START, ["a", "b"])], edges=[("a", END), ("b", END)])
    t = asg.tracker()
    assert t.running == {START: 1} and not t.triggered and not t.done
    assert t.steps() == {"a": 1, "b": 1}
    t.finish(START, goto="b")
    assert t.triggered == {"b"}
    assert t.steps() == {"a": INF, "b": 0}
    with pytest.raises(WorkflowError, match="START|__start__"):
        t.start(START)


def test_and_join_costs_max_of_members_not_arrived():
    # a and b -> c; b is two steps behind a.
    t = build(
        ["a", "pre_b", "b", "c"],
        edges=[(START, "a"), (START, "pre_b"), ("pre_b", "b")],
        joins=[(("a", "b"), "c")],
    ).tracker()
    assert t.steps() == {"a": 0, "pre_b": 0, "b": 1, "c": 2}
    run(t, "a")  # a arrived: c now waits on b alone
    assert t.steps() == {"a": INF, "pre_b": 0, "b": 1, "c": 2}
    run(t, "pre_b")
    assert t.steps()["c"] == 1
    run(t, "b")
    assert t.triggered == {"c"}
    assert t.steps()["c"] == 0


def test_and_join_waiting_on_a_member_that_cannot_run_is_inf():
    asg = build(["r", "a", "b", "c"], edges=[(START, "r")], branches=[("r", ["a", "b"])],
                joins=[(("a", "b"), "c")])
    t = asg.tracker()
    assert t.steps()["c"] == 2  # r may fan out to both
    run(t, "r", goto="a")  # the router chose a only: b can never run, so c never will
    assert t.steps() == {"r": INF, "a": 0, "b": INF, "c": INF}
    run(t, "a")
    assert t.steps()["c"] == INF and t.done


def test_and_join_inside_a_cycle_resets_its_flags():
    asg = build(
        ["split", "a", "b", "merge"],
        edges=[(START, "split"), ("split", "a"), ("split", "b")],
        joins=[(("a", "b"), "merge")],
        branches=[("merge", ["split", END])],
    )
    t = asg.tracker()
    for _ in range(3):
        run(t, "split")
        assert t.steps() == {"split": 2, "a": 0, "b": 0, "merge": 1}
        run(t, "a")
        # a's flag is set, so the join only waits for b; a can run again only through split.
        assert t.steps() == {"split": 2, "a": 3, "b": 0, "merge": 1}
        run(t, "b")
        assert t.steps() == {"split": 1, "a": 2, "b": 2, "merge": 0}
        run(t, "merge", goto="split")
    assert t.triggered == {"split"}
    run(t, "split")
    run(t, "a")
    run(t, "b")
    run(t, "merge", goto=END)
    assert t.done


def test_member_finishing_twice_counts_once():
    asg = build(
        ["a", "b", "c"],
        edges=[(START, "a"), (START, "b")],
        joins=[(("a", "b"), "c")],
        branches=[("a", ["a", END])],
    )
    t = asg.tracker()
    run(t, "a", goto="a")
    run(t, "a")  # arrives again before b: still one arrival
    assert t.triggered == {"b"}
    assert t.steps()["c"] == 1
    run(t, "b")
    assert t.triggered == {"c"}


def test_running_is_a_multiset_and_triggered_a_set():
    asg = build(["s", "x", "y"], edges=[(START, "s"), ("s", "x"), ("s", "y"), ("y", "x")])
    t = asg.tracker()
    run(t, "s")
    t.start("x", tasks=2)  # e.g. two LangGraph Send tasks of one node
    assert t.running == {"x": 2}
    run(t, "y")
    # x is running and triggered at once (cycle-free re-trigger by y)
    assert t.running == {"x": 2} and t.triggered == {"x"}
    assert t.steps() == {"s": INF, "x": 0, "y": INF}
    t.finish("x")
    t.finish("x")
    with pytest.raises(WorkflowError, match="not running"):
        t.finish("x")
    t.start("x")
    t.finish("x")
    assert t.done


def test_retriggering_is_idempotent():
    asg = build(["a", "b", "c"], edges=[(START, "a"), (START, "b"), ("a", "c"), ("b", "c")])
    t = asg.tracker()
    run(t, "a")
    run(t, "b")
    assert t.triggered == {"c"}
    t.start("c")
    with pytest.raises(WorkflowError, match="not triggered"):
        t.start("c")


def test_shared_agent_identity_takes_the_min():
    asg = build(
        ["writer", "review_1", "edit", "review_2"],
        edges=[(START, "writer"), ("writer", "review_1"), ("review_1", "edit"), ("edit", "review_2")],
        agents={"review_1": "reviewer", "review_2": "reviewer"},
    )
    t = asg.tracker()
    assert t.agent_steps() == {"writer": 0, "reviewer": 1, "edit": 2}
    run(t, "writer")
    run(t, "review_1")
    assert t.agent_steps() == {"writer": INF, "reviewer": 1, "edit": 0}
    run(t, "edit")
    assert t.agent_steps() == {"writer": INF, "reviewer": 0, "edit": INF}


def test_plain_python_nodes_have_steps_but_no_agent():
    wf = Workflow("mixed")
    wf.add_agent("llm", system="S")
    wf.add_node("tool", fn)
    wf.add_edge(START, "tool")
    wf.add_edge("tool", "llm")
    t = wf.compile().tracker()
    assert t.steps() == {"llm": 1, "tool": 0}
    assert t.agent_steps() == {"llm": 1}


def test_misuse_raises_and_leaves_state_unchanged():
    t = company().tracker()
    with pytest.raises(WorkflowError, match="'architect' is not triggered"):
        t.start("architect")
    with pytest.raises(WorkflowError, match="'pm' is not running"):
        t.finish("pm")
    with pytest.raises(WorkflowError, match="'ghost'"):
        t.start("ghost")
    with pytest.raises(WorkflowError, match="tasks"):
        t.start("pm", tasks=0)
    assert t.triggered == {"pm"}
    t.start("pm")
    with pytest.raises(WorkflowError, match="not a declared target"):
        t.finish("pm", goto="qa")  # pm has no conditional edges
    assert t.running == {"pm": 1}
    t.finish("pm")
    for node in ("architect", "engineer"):
        run(t, node)
    t.start("qa")
    with pytest.raises(WorkflowError, match="'pm'.*declared"):
        t.finish("qa", goto=["engineer", "pm"])
    assert t.running == {"qa": 1} and not t.triggered
    t.finish("qa", goto=["engineer"])
    assert t.triggered == {"engineer"}


def test_views_are_read_only():
    t = company().tracker()
    with pytest.raises(TypeError):
        t.running["pm"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        t.triggered.add("qa")  # type: ignore[attr-defined]
