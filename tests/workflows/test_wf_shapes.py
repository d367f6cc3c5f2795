"""The bundled workflows compile to the intended Agent Step Graphs (checked through steps) and
expose a default ``workflow`` attribute for ``kvflow graph``/``kvflow run``; bad parameters are
clear errors."""

from __future__ import annotations

import math

import pytest

import workflows.map_reduce as map_reduce_mod
import workflows.metagpt as metagpt_mod
import workflows.peer as peer_mod
import workflows.synthetic as synthetic_mod
from kvflow_orch import END, Workflow
from workflows.map_reduce import map_reduce
from workflows.metagpt import metagpt
from workflows.peer import peer
from workflows.synthetic import synthetic


@pytest.mark.parametrize("module", [metagpt_mod, peer_mod, map_reduce_mod, synthetic_mod])
def test_default_attribute_is_a_workflow(module):
    assert isinstance(module.workflow, Workflow)
    module.workflow.compile()


def test_metagpt_pipeline_then_fix_loop():
    asg = metagpt().compile()
    t = asg.tracker()
    assert t.steps() == {"product_manager": 0, "architect": 1, "project_manager": 2, "engineer": 3, "qa": 4}
    for node in ("product_manager", "architect", "project_manager", "engineer"):
        t.start(node)
        t.finish(node)
    t.start("qa")
    assert t.steps()["engineer"] == 1 and math.isinf(t.steps()["architect"])
    t.finish("qa", goto=END)
    assert t.done


def test_metagpt_backlog_comes_back_to_the_product_manager():
    t = metagpt(fix_rounds=0, backlog=True).compile().tracker()
    for node in ("product_manager", "architect", "project_manager", "engineer"):
        t.start(node)
        t.finish(node)
    t.start("qa")
    # QA may ship the next project or send the code back: both are one step away, and the roles
    # after the ProductManager follow in pipeline order (what kvflow keeps, LRU evicts first)
    steps = t.steps()
    assert (steps["product_manager"], steps["engineer"], steps["architect"], steps["project_manager"]) == (1, 1, 2, 3)
    t.finish("qa", goto="product_manager")
    assert t.steps()["product_manager"] == 0


def test_peer_is_cyclic():
    t = peer().compile().tracker()
    for node in ("planner", "executor", "expresser", "reviewer"):
        t.start(node)
        if node == "reviewer":
            assert t.steps()["planner"] == 1  # the reviewer may send the work back
            t.finish(node, goto="planner")
        else:
            t.finish(node)
    assert t.steps()["planner"] == 0 and t.steps()["reviewer"] == 3


def test_map_reduce_fans_out_and_joins():
    asg = map_reduce(3).compile()
    assert asg.agents["mapper"] == ("map_0", "map_1", "map_2")
    t = asg.tracker()
    t.start("split")
    t.finish("split")
    assert t.triggered == {"map_0", "map_1", "map_2"}
    for m in ("map_0", "map_1", "map_2"):
        t.start(m)
    t.finish("map_0")
    t.finish("map_1")
    assert "reducer" not in t.triggered and t.steps()["reducer"] == 1
    t.finish("map_2")
    assert t.triggered == {"reducer"}


def test_synthetic_is_sequential_and_loops():
    asg = synthetic(n_agents=4, fixed=16, rounds=2).compile()
    steps = asg.tracker().steps()
    assert steps == {"s00": 0, "s01": 1, "s02": 2, "s03": 3}
    t = asg.tracker()
    for node in ("s00", "s01", "s02", "s03"):
        t.start(node)
        t.finish(node, goto="s00" if node == "s03" else None)
    assert t.steps() == {"s00": 0, "s01": 1, "s02": 2, "s03": 3}


def test_synthetic_branches_make_each_stage_an_or():
    asg = synthetic(n_agents=3, fixed=16, rounds=1, branches=2).compile()
    assert asg.tracker().steps() == {"s00_b0": 1, "s00_b1": 1, "s01_b0": 2, "s01_b1": 2, "s02_b0": 3, "s02_b1": 3}


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: synthetic(n_agents=0), "n_agents"),
        (lambda: synthetic(branches=0), "branches"),
        (lambda: synthetic(fixed=-1), "fixed"),
        (lambda: metagpt(fix_rounds=-1), "fix_rounds"),
        (lambda: peer(rounds=0), "rounds"),
        (lambda: map_reduce(0), "n must be"),
    ],
)
def test_bad_parameters(build, message):
    with pytest.raises(ValueError, match=message):
        build()
