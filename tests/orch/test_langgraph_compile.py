"""compile_langgraph: a real LangGraph StateGraph compiles to the same Agent Step Graph as the same
graph written in the kvflow DSL — the same trigger structure and, along identical executions driven
through both trackers, the same steps after every transition."""

from __future__ import annotations

import math
import operator
import random
import warnings
from typing import Annotated, Literal, TypedDict

import pytest
from langgraph.graph import StateGraph
from langgraph.types import Command

from kvflow_orch import END, START, AgentStepGraph, Workflow, WorkflowError
from kvflow_orch.langgraph import UndeclaredTargetsWarning, compile_langgraph


class State(TypedDict, total=False):
    n: int
    log: Annotated[list, operator.add]


def noop(state: State) -> dict:
    return {}


def dsl(name: str, nodes: list[str], agents: dict | None = None) -> Workflow:
    wf = Workflow(name)
    for node in nodes:
        agent = (agents or {}).get(node, node)
        if agent is None:
            wf.add_node(node, noop)
        else:
            wf.add_agent(node, system="", agent=agent)
    return wf


def lg(nodes: list[str], **node_kwargs) -> StateGraph:
    g = StateGraph(State)
    for node in nodes:
        fn, kwargs = node_kwargs.get(node, (noop, {}))
        g.add_node(node, fn, **kwargs)
    return g


def add_edges(g: StateGraph, wf: Workflow, pairs) -> None:
    for a, b in pairs:
        g.add_edge(a, b)
        wf.add_edge(a, b)


# ---------------------------------------------------------------- shapes (LangGraph, DSL twin)
def sequential():
    nodes = ["pm", "architect", "engineer"]
    g, wf = lg(nodes), dsl("seq", nodes)
    add_edges(g, wf, [(START, "pm"), ("pm", "architect"), ("architect", "engineer"), ("engineer", END)])
    return g.compile(), wf


def fan_out_and_join():
    nodes = ["pm", "fe", "be", "engineer", "qa"]
    g, wf = lg(nodes), dsl("join", nodes)
    add_edges(g, wf, [(START, "pm"), ("pm", "fe"), ("pm", "be"), ("engineer", "qa"), ("qa", END)])
    g.add_edge(["fe", "be"], "engineer")
    wf.add_edge(["fe", "be"], "engineer")
    return g.compile(), wf


def qa_route(state: State) -> str:
    return "ship"


def conditional_loop():
    nodes = ["pm", "engineer", "qa"]
    g, wf = lg(nodes), dsl("loop", nodes)
    add_edges(g, wf, [(START, "pm"), ("pm", "engineer"), ("engineer", "qa")])
    path_map = {"fix": "engineer", "ship": END}
    g.add_conditional_edges("qa", qa_route, path_map)
    wf.add_conditional_edges("qa", qa_route, path_map)
    return g, wf  # the uncompiled StateGraph is accepted too


def review_router(state: State) -> Literal["writer", "editor", "__end__"]:
    return "__end__"


def literal_router():
    nodes = ["writer", "critic", "editor"]
    g, wf = lg(nodes), dsl("literal", nodes)
    add_edges(g, wf, [(START, "writer"), ("writer", "critic"), ("editor", "critic")])
    g.add_conditional_edges("critic", review_router)
    wf.add_conditional_edges("critic", review_router)
    return g.compile(), wf


def dispatcher(state: State) -> Command[Literal["coder", "tester", "__end__"]]:
    return Command(goto="coder")


def command_node():
    nodes = ["plan", "dispatch", "coder", "tester"]
    g = lg(nodes, dispatch=(dispatcher, {}))
    wf = dsl("command", nodes)
    add_edges(g, wf, [(START, "plan"), ("plan", "dispatch"), ("coder", "dispatch"), ("tester", "dispatch")])
    wf.add_conditional_edges("dispatch", dispatcher, ["coder", "tester", END])
    return g.compile(), wf


def undeclared_router():
    nodes = ["a", "b", "c"]
    g, wf = lg(nodes), dsl("undeclared", nodes)
    add_edges(g, wf, [(START, "a"), ("a", "b")])
    g.add_conditional_edges("b", lambda s: "c")
    wf.add_conditional_edges("b", lambda s: "c", ["a", "b", "c", END])
    return g.compile(), wf


SHAPES = [sequential, fan_out_and_join, conditional_loop, literal_router, command_node]


# ---------------------------------------------------------------- equivalence along executions
def same_structure(a: AgentStepGraph, b: AgentStepGraph) -> None:
    assert set(a.nodes) == set(b.nodes)
    assert dict(a.agents) == dict(b.agents)
    assert sorted((tuple(sorted(m)), t) for m, t in a.joins) == sorted((tuple(sorted(m)), t) for m, t in b.joins)
    for node in [START, *a.nodes]:
        assert set(a.plain_targets(node)) == set(b.plain_targets(node)), node
        assert sorted(sorted(br.targets) for br in a.branches_of(node)) == sorted(
            sorted(br.targets) for br in b.branches_of(node)
        ), node


def drive_both(a: AgentStepGraph, b: AgentStepGraph, seed: int, moves: int = 60) -> int:
    """Random valid execution (choices made on ``a``), mirrored on ``b``; steps compared each move."""
    rng = random.Random(seed)
    ta, tb = a.tracker(), b.tracker()
    compared = 0
    for _ in range(moves):
        assert ta.steps() == tb.steps()
        assert ta.agent_steps() == tb.agent_steps()
        assert ta.done == tb.done
        compared += 1
        if ta.done:
            break
        options = [("start", n) for n in sorted(ta.triggered)] + [("finish", n) for n in sorted(ta.running)]
        op, node = rng.choice(options)
        if op == "start":
            ta.start(node)
            tb.start(node)
        else:
            targets = sorted({t for br in a.branches_of(node) for t in br.targets})
            goto = rng.choice(targets) if targets else None
            ta.finish(node, goto)
            tb.finish(node, goto)
    return compared


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.__name__)
def test_langgraph_steps_equal_dsl_steps(shape):
    graph, wf = shape()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # declared graphs compile without any warning
        from_lg = compile_langgraph(graph)
    from_dsl = wf.compile()
    same_structure(from_lg, from_dsl)
    assert sum(drive_both(from_lg, from_dsl, seed) for seed in range(20)) > 40


def test_undeclared_router_warns_once_naming_the_edge_and_goes_anywhere():
    graph, wf = undeclared_router()
    with pytest.warns(UndeclaredTargetsWarning) as record:
        from_lg = compile_langgraph(graph)
    assert len(record) == 1
    message = str(record[0].message)
    assert "'b'" in message and "path_map" in message and "Literal" in message
    from_dsl = wf.compile()
    same_structure(from_lg, from_dsl)
    for seed in range(10):
        drive_both(from_lg, from_dsl, seed)
    # Any node may follow b, so while b runs every node is one step away.
    t = from_lg.tracker()
    t.start("a")
    t.finish("a")
    t.start("b")
    assert t.steps() == {"a": 1, "b": 0, "c": 1}


def unannotated_command(state: State):
    return Command(goto="a")


def test_unannotated_command_node_is_dynamic_with_a_warning():
    g = lg(["a", "b"], b=(unannotated_command, {}))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    with pytest.warns(UndeclaredTargetsWarning, match=r"'b'.*Command\[Literal"):
        asg = compile_langgraph(g)
    assert sorted(t for br in asg.branches_of("b") for t in br.targets) == sorted(["a", "b", END])


def test_destinations_declare_command_targets():
    g = lg(["a", "b"], b=(unannotated_command, {"destinations": ("a", END)}))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asg = compile_langgraph(g)
    assert sorted(t for br in asg.branches_of("b") for t in br.targets) == sorted(["a", END])


def test_conditional_start_and_send_fan_out():
    from langgraph.types import Send

    def pick(state: State) -> Literal["left", "right"]:
        return "left"

    def scatter(state: State):
        return [Send("worker", state), Send("worker", state)]

    g = lg(["left", "right", "worker", "reduce"])
    g.add_conditional_edges(START, pick)
    g.add_conditional_edges("left", scatter, ["worker"])
    g.add_edge("right", "reduce")
    g.add_edge("worker", "reduce")
    asg = compile_langgraph(g)
    t = asg.tracker()
    assert t.steps() == {"left": 1, "right": 1, "worker": 2, "reduce": 2}
    t.finish(START, "left")
    assert t.steps() == {"left": 0, "right": math.inf, "worker": 1, "reduce": 2}
    t.start("left")
    t.finish("left", ["worker"])
    t.start("worker", tasks=2)  # two Send tasks
    t.finish("worker")
    assert t.steps()["worker"] == 0 and t.steps()["reduce"] == 0


def test_agents_map_identities_and_non_llm_nodes():
    graph, _ = fan_out_and_join()
    asg = compile_langgraph(graph, agents={"fe": "dev", "be": "dev", "qa": None})
    assert dict(asg.agents) == {"pm": ("pm",), "dev": ("fe", "be"), "engineer": ("engineer",)}
    assert asg.agent_of("qa") is None
    t = asg.tracker()
    assert t.agent_steps() == {"pm": 0, "dev": 1, "engineer": 2}
    t.start("pm")
    t.finish("pm")
    t.start("fe")
    t.finish("fe")  # be has not arrived: dev (be) is 0, engineer waits for it
    assert t.agent_steps() == {"pm": math.inf, "dev": 0, "engineer": 1}


def test_the_old_from_langgraph_name_still_compiles_and_says_it_is_deprecated():
    graph, wf = conditional_loop()
    with pytest.warns(DeprecationWarning, match="kvflow_orch.langgraph.compile_langgraph"):
        asg = AgentStepGraph.from_langgraph(graph)
    same_structure(asg, wf.compile())


def test_error_handler_nodes_are_skipped():
    g = lg(["b"])
    g.add_node("a", noop, error_handler=noop)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    compiled = g.compile()
    assert "__error_handler__a" in compiled.builder.nodes
    assert set(compile_langgraph(compiled).nodes) == {"a", "b"}


def test_bad_inputs_are_clear_errors():
    with pytest.raises(WorkflowError, match="StateGraph"):
        compile_langgraph(object())
    graph, _ = sequential()
    with pytest.raises(WorkflowError, match="ghost"):
        compile_langgraph(graph, agents={"ghost": "x"})
    with pytest.raises(WorkflowError, match="agents\\['pm'\\]"):
        compile_langgraph(graph, agents={"pm": 3})
