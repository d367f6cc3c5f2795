"""The learner end to end in process: learned steps follow the workflow, declared hints win, hostile
traffic stays bounded, and the step seam agrees with an independent solve."""

from __future__ import annotations

import math
import random

from backends.learn import LearnerConfig, TrafficLearner, session_agent
from backends.learn.steps import chain_from_counts

from test_agents_and_sessions import chat

SUPERVISOR = "You are the Supervisor. Route each task to the right worker and finish when done."
CODER = "You are a Python Coder. Write code."
TESTER = "You are a QA Tester. Check code."
DOCS = "You are a Docs Writer. Document code."


def run_session(learner: TrafficLearner, task: str, workers: list[str]) -> list:
    """supervisor -> worker -> supervisor ... as a supervisor framework sends it (no hints, no keys)."""
    turns = [("user", task)]
    out = []
    for worker in [*workers, None]:
        for system in ([SUPERVISOR] if worker is None else [SUPERVISOR, worker]):
            learned = learner.observe(chat(system, *turns))
            reply = f"{learned.agent} answered the task {task} with a fairly long line of text"
            learner.reply(learned, {"content": reply})
            turns.append(("assistant", reply))
            out.append(learned)
    return out


def test_learned_steps_rank_the_likely_next_agent_first() -> None:
    learner = TrafficLearner(LearnerConfig(refresh=1))
    rng = random.Random(7)
    for s in range(40):
        run_session(learner, f"task {s} {rng.random()}", [CODER, TESTER] if s % 4 else [CODER, DOCS])
    # each session is one workflow: every request of a session carries the same workflow id
    learned = run_session(learner, "the final task", [CODER, TESTER])
    assert len({x.session_id for x in learned}) == 1
    assert {x.source for x in learned} == {"learned"}
    # the session's agents, named per session (session_agent): the supervisor runs; the coder most likely next
    sid = learned[0].session_id
    steps = {name.removesuffix(f"@{sid}"): v for name, v in learned[0].hint.steps.items()}
    assert learned[0].hint.agent == session_agent("supervisor", sid) and steps["supervisor"] == 0
    assert 1 <= steps["python-coder"] < steps["qa-tester"] < steps["docs-writer"] < math.inf
    after_coder = {name.removesuffix(f"@{sid}"): v for name, v in learned[1].hint.steps.items()}
    assert after_coder["python-coder"] == 0 and 1 <= after_coder["supervisor"] < 1.1
    stats = learner.stats()
    assert stats["learned_agents"] == 4 and stats["learned_hint_requests"] == 41 * 5  # 5 requests a session
    edges = {(t["from"], t["to"]): t["probability"] for t in learner.graph()["namespaces"]["learned"]["transitions"]}
    assert edges[("python-coder", "supervisor")] > 0.9
    assert edges[("supervisor", "python-coder")] > edges[("supervisor", "docs-writer")]


def test_a_declared_hint_wins_for_its_session() -> None:
    from kvflow_orch.protocol import KVFlowHint

    learner = TrafficLearner()
    declared = KVFlowHint(workflow_id="wf-1", agent="planner", steps={"planner": 0, "coder": 1})
    first = learner.observe(chat(SUPERVISOR, ("user", "declared task")), declared=declared)
    assert first.hint is declared and first.source == "declared"
    learner.reply(first, {"content": "the plan for the declared task, written out in a long line"})
    # the same workflow, a later request without the hint: no learned hint competes with the declared steps
    follow = learner.observe(chat(CODER, ("user", "declared task"),
                                  ("assistant", "the plan for the declared task, written out in a long line")))
    assert follow.session_id == first.session_id and follow.hint is None and follow.source == "unhinted"
    other = learner.observe(chat(CODER, ("user", "an undeclared task")))
    assert other.source == "learned"
    stats = learner.stats()
    assert (stats["declared_hint_requests"], stats["learned_hint_requests"], stats["unhinted_requests"],
            stats["declared_session_requests"]) == (1, 1, 1, 1)
    assert all(u.workflow_id != first.session_id for u in learner.ended())


def test_ten_thousand_hostile_system_prompts_and_keys_stay_bounded() -> None:
    cfg = LearnerConfig(max_sessions=500, max_agents=300, max_index_entries=2000, max_model_agents=16)
    learner = TrafficLearner(cfg)
    rng = random.Random(1)
    for i in range(10_000):
        system = "".join(rng.choice("abcdefghij \n.") for _ in range(rng.randint(0, 300))) + str(i)
        body = chat(system, ("user", f"{rng.random()}\n" * rng.randint(0, 4)),
                    model=rng.choice(["m", "n", ""]), **rng.choice([{}, {"user": str(i)}, {"user": {"x": i}},
                                                                     {"metadata": {"session_id": [i]}}]))
        learned = learner.observe(body)
        assert learned.hint is not None
        learner.reply(learned, {"content": system[:50] + "\n" + "y" * 30})
        learner.ended()
    stats = learner.stats()
    assert stats["learned_agents"] <= cfg.max_agents and stats["live_sessions"] <= cfg.max_sessions
    assert all(len(m) <= cfg.max_model_agents for m in learner.models.values())
    assert stats["bad_session_keys"] > 1000
    tables = learner.sessions._by_turns, learner.sessions._by_line, learner.sessions._by_key, learner.agents._exact
    assert max(len(t) for t in tables) <= cfg.max_index_entries  # the content index is bounded too


def test_the_step_seam_agrees_with_a_solve_per_target() -> None:
    # counts well past step math's thin-statistics guard (which would pool them to uniform)
    counts = {"a": {"b": 600, "c": 200}, "b": {"a": 500, "c": 100}, "c": {"a": 100}}
    ends = {"a": 100, "b": 0, "c": 300}
    alpha = 0.5
    model = chain_from_counts(counts, ends, alpha)
    states = list(model.states)
    p = {s: {} for s in states}
    for s, row in counts.items():
        total = sum(row.values()) + ends[s] + alpha * (len(row) + 1)
        p[s] = {t: (c + alpha) / total for t, c in row.items()}
    for current in states:
        got = model.steps(current)
        for v in states:
            if v == current:
                assert got[v] == 0
                continue
            h, g = _hit_and_time(p, states, v)
            expected = max(1.0, g[current] / h[current] ** 2)
            assert math.isclose(got[v], expected, rel_tol=1e-5), (current, v, got[v], expected)


def _hit_and_time(p, states, v):
    """Fixed-point iteration of h = c + A h, g = h + A g with A the transitions avoiding ``v``."""
    h = {s: 0.0 for s in states}
    g = {s: 0.0 for s in states}
    for _ in range(5000):
        h = {s: p[s].get(v, 0.0) + sum(q * h[w] for w, q in p[s].items() if w != v) for s in states}
    for _ in range(5000):
        g = {s: h[s] + sum(q * g[w] for w, q in p[s].items() if w != v) for s in states}
    return h, g
