"""run()/arun_many() with branch statistics: every routing decision is learned, hints and steps
updates carry the expected steps, KVFLOW_BRANCH_STATS persists them across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from runtime_graphs import LOOP_HINTS, review_loop

from kvflow_orch import END, START, BranchStats, Workflow, WorkflowError
from kvflow_orch.runtime import run, run_many

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_router_decisions_are_learned_and_hints_carry_expected_steps(server):
    stats = BranchStats()
    result = run(review_loop(rounds=12), {"idea": "x"}, backend=server.url, branch_stats=stats)
    assert result.state["rounds"] == 12
    assert stats.decisions("loop", "count") == 12
    assert stats.probabilities("loop", "count", ["eng", END]) == pytest.approx({"eng": 12 / 14, END: 2 / 14})
    qa = [h["steps"] for h in server.hints() if h["agent"] == "qa"]
    assert len(qa) == 12
    # The run learns while it runs. Its first decisions are too few to rank eng apart from END, so
    # the steps stay static (count, then eng: 2); by the 12th review the router has fixed 11 times,
    # p(eng) = 12/13, and eng is E[T | runs] / P(runs) = 2 / (12/13) steps away.
    assert qa[0] == {"pm": None, "eng": 2, "qa": 0}
    assert qa[-1]["eng"] == pytest.approx(2 * 13 / 12, rel=1e-5)
    assert qa[5]["eng"] == 2 and qa[8]["eng"] > qa[-1]["eng"] > 2  # 8 fixes in a row are significant, 5 not yet
    # Steps updates while count decides carry eng 1 step away at the p(eng) = k/(k+1) learned so far.
    # The outbox coalesces updates per workflow, and the run's done can replace the last of them, so
    # which k survive depends on timing: every one that does must be such a learned value.
    updates = [u["steps"] for u in server.steps_updates() if not u["done"]]
    learning = [u["eng"] for u in updates if 1 < u["eng"] < 2]
    learned = [(k + 1) / k for k in range(1, 13)]
    assert learning and all(any(e == pytest.approx(v, rel=1e-5) for v in learned) for e in learning), learning
    before = len(server.hints())
    run(review_loop(rounds=3), {"idea": "y"}, backend=server.url, branch_stats=stats)
    hints = [(h["agent"], h["steps"]) for h in server.hints()[before:]]
    # the next run starts from what the first learned; the deterministic part is static
    assert hints[1] == ("eng", {"pm": None, "eng": 0, "qa": 1})
    assert hints[2][0] == "qa" and hints[2][1]["eng"] == pytest.approx(2 * 14 / 12, rel=1e-5)
    assert stats.decisions("loop", "count") == 15


def test_static_stays_the_default(server, monkeypatch):
    monkeypatch.delenv("KVFLOW_BRANCH_STATS", raising=False)
    run(review_loop(), {"idea": "x"}, backend=server.url)
    assert [(h["agent"], h["steps"]) for h in server.hints()] == LOOP_HINTS


def test_run_many_shares_the_statistics(server):
    stats = BranchStats()
    run_many(review_loop(rounds=2), [{"idea": "a"}, {"idea": "b"}, {"idea": "c"}], backend=server.url,
             branch_stats=stats)
    assert stats.decisions("loop", "count") == 6


def test_bad_branch_stats_argument(server):
    with pytest.raises(WorkflowError, match="branch_stats must be a BranchStats"):
        run(review_loop(), {"idea": "x"}, backend=server.url, branch_stats={"count": 1})


def test_bad_stats_file_names_the_variable(server, tmp_path, monkeypatch):
    path = tmp_path / "stats.json"
    path.write_text("{not json")
    monkeypatch.setenv("KVFLOW_BRANCH_STATS", str(path))
    with pytest.raises(WorkflowError, match="KVFLOW_BRANCH_STATS=.*not JSON"):
        run(review_loop(), {"idea": "x"}, backend=server.url)


SCRIPT = """
from kvflow_orch import END, START, Workflow, run
wf = Workflow("router")
wf.add_node("pick", lambda s: {"n": s.get("n", 0) + 1})
wf.add_node("a", lambda s: None)
wf.add_node("b", lambda s: None)
wf.add_edge(START, "pick")
wf.add_edge("a", "pick")
wf.add_edge("b", "pick")
wf.add_conditional_edges("pick", lambda s: END if s["n"] > 16 else ("a" if s["n"] % 4 else "b"), ["a", "b", END])
run(wf, {}, backend="local")
"""


def test_stats_file_persists_across_processes(tmp_path):
    path = tmp_path / "stats.json"
    env = {**os.environ, "KVFLOW_BRANCH_STATS": str(path), "PYTHONPATH": ROOT}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=120, cwd=ROOT)
    data = json.loads(path.read_text())
    (router,) = data["routers"]
    assert (router["workflow"], router["router"]) == ("router", "pick")
    assert router["decisions"] == 34 and router["counts"] == {"a": 24.0, "b": 8.0, END: 2.0}
    stats = BranchStats.load(path)
    asg_steps = _expected_after_pick(stats)
    assert asg_steps["a"] < asg_steps["b"]


def _expected_after_pick(stats: BranchStats) -> dict[str, float]:
    wf = Workflow("router")
    for name in ("pick", "a", "b"):
        wf.add_node(name, lambda s: None)
    wf.add_edge(START, "pick")
    wf.add_edge("a", "pick")
    wf.add_edge("b", "pick")
    wf.add_conditional_edges("pick", lambda s: END, ["a", "b", END])
    tracker = wf.compile().tracker(stats)
    tracker.start("pick")
    return tracker.steps()
