"""Continuations: a conversation kept across its agent's tool pause, ranked, capped and expired."""

from __future__ import annotations

import math

import pytest

from backends.kvcache import AgentRequest, Reservation
from backends.kvcache.continuations import (DEADLINE_GRACE_S, DEADLINE_SLACK, TOOL_WINDOW, ToolDurations, hold_for,
                                           mean_residual_s)
from kvflow_orch.protocol import KVFlowHint

CONVERSATION = list(range(100, 124))  # 24 tokens: the paused agent's prompt and reply
SESSION = ("default", "user-7")


def turn(cache, prompt, outputs, request: AgentRequest):
    """Accept, reserve, 'compute', release: one model call the way a host runs it."""
    decision = cache.accept(request)
    r = cache.reserve(prompt, len(outputs))
    assert isinstance(r, Reservation)
    computed = (list(prompt) + list(outputs))[: len(prompt) + len(outputs) - 1]
    cache.release(r, computed, decision)
    cache.check_integrity()
    return decision


def pressure(cache, base: int, rounds: int = 4, length: int = 20):
    """Other sessions' calls, each new, enough to evict everything unprotected from a 64-token pool."""
    for i in range(rounds):
        prompt = list(range(base + 100 * i, base + 100 * i + length))
        turn(cache, prompt, [1], AgentRequest(prompt))


def on_device(cache, tokens) -> int:
    return cache.match_prefix(tokens).device_tokens


def paused_cache(make_cache, **options):
    cache = make_cache(device_tokens=64, **options)
    turn(cache, CONVERSATION[:20], CONVERSATION[20:] + [0], AgentRequest(CONVERSATION[:20], session="user-7"))
    return cache


def test_a_reply_ending_in_tool_calls_keeps_the_conversation_through_other_agents_pressure(make_cache):
    kept = paused_cache(make_cache)
    assert kept.pause(SESSION, ["search"])
    pressure(kept, 1000)
    assert on_device(kept, CONVERSATION) == 24
    assert kept.intake.counters["continuations_kept"] == 1

    lru_like = paused_cache(make_cache)  # same traffic, no pause reported: LRU order evicts it
    pressure(lru_like, 1000)
    assert on_device(lru_like, CONVERSATION) == 0


def test_without_continuations_a_pause_keeps_nothing(make_cache):
    cache = paused_cache(make_cache, continuations=False)
    assert not cache.pause(SESSION, ["search"])
    pressure(cache, 1000)
    assert on_device(cache, CONVERSATION) == 0 and cache.intake.counters["continuations_kept"] == 0


def test_a_session_nobody_named_has_nothing_to_keep(make_cache):
    cache = make_cache(device_tokens=64)
    turn(cache, CONVERSATION[:20], [1, 2], AgentRequest(CONVERSATION[:20]))  # no session key, no hint
    assert not cache.pause(SESSION, ["search"])
    assert cache.intake.counters["continuations_kept"] == 0


def test_past_its_deadline_the_conversation_is_as_evictable_as_any_suffix(make_cache, clock):
    cache = paused_cache(make_cache, tool_cold_hold_s=4.0)
    cache.pause(SESSION, ["search"])
    deadline = 4.0
    clock.now += deadline - 0.01
    cache.expire()
    assert cache.intake.counters["continuations_expired"] == 0
    clock.now += 0.02
    pressure(cache, 1000)
    assert cache.intake.counters["continuations_expired"] == 1
    assert on_device(cache, CONVERSATION) == 0
    assert all(not node.tags for node in cache.tree)  # no tag outlives its record
    assert len(cache.intake.continuations) == 0 and cache.hints.workflow_count == 0


def test_a_tool_that_outlasts_its_deadline_is_learned_from_its_late_return(make_cache, clock):
    cache = paused_cache(make_cache)
    cache.pause(SESSION, ["build"])
    clock.now += 40.0  # past the 30 s a tool never observed is kept
    cache.accept(AgentRequest(CONVERSATION + [7], session="user-7"))
    assert cache.intake.counters["continuations_expired"] == 1 and cache.intake.counters["continuations_reused"] == 0
    learned = cache.intake.continuations.durations.estimate("default", ["build"])
    assert learned.expected_s == pytest.approx(40.0)
    assert learned.hold_s == pytest.approx(40.0 * DEADLINE_SLACK + DEADLINE_GRACE_S)


def test_the_return_before_the_deadline_is_reused_and_teaches_the_tools_duration(make_cache, clock):
    cache = paused_cache(make_cache)
    cache.pause(SESSION, ["search"])
    clock.now += 1.25
    back = CONVERSATION + [7, 8, 9]  # the conversation plus the tool's result
    cache.accept(AgentRequest(back, session="user-7"))
    decision = cache.accept(AgentRequest(back, session="user-7"))  # a second arrival is no second reuse
    assert not decision.resumes
    assert cache.intake.counters["continuations_reused"] == 1
    assert cache.intake.continuations.durations.estimate("default", ["search"]).expected_s == pytest.approx(1.25)
    r = cache.reserve(back, 2)
    assert r.reused == 24  # the whole kept conversation was still there
    cache.release(r, back + [1], decision._replace(resumes=True))
    assert len(cache.intake.continuations) == 0  # the turn ended without a new pause: dropped
    assert cache.intake.counters["continuations_expired"] == 0


def test_an_announced_pause_keeps_the_conversation_for_the_client_s_time(make_cache, clock):
    cache = make_cache(device_tokens=64)
    hint = KVFlowHint(workflow_id="w", agent="coder", resume_in_s=10.0)
    turn(cache, CONVERSATION[:20], CONVERSATION[20:] + [0], AgentRequest(CONVERSATION[:20], hint))
    kept = cache.intake.continuations.get(("default", "w/coder"))
    assert kept is not None and kept.deadline == pytest.approx(clock.now + 10.0 * DEADLINE_SLACK + DEADLINE_GRACE_S)
    clock.now += 12.0
    pressure(cache, 1000)
    assert on_device(cache, CONVERSATION) == 24


def test_a_continuation_ranks_by_expected_time_to_reuse_in_steps(make_cache):
    """The step unit is one model call (step_default_s before any call was timed): a tool expected
    back in 5 s is five steps away, evicted before a fixed prompt one step away and after one ten
    steps away."""
    cache = paused_cache(make_cache, step_default_s=1.0)
    cache.intake.continuations.step_s = 1.0  # the timed call in paused_cache took 0 s on the fake clock
    cache.pause(SESSION, [], resume_in_s=5.0)
    ref = cache.intake.continuations.get(SESSION).ref
    assert cache.hints.steps(ref) == 5.0
    near, far = [7] * 16, [8] * 16
    for agent, prompt, steps in (("near", near, 1), ("far", far, 10)):
        hint = KVFlowHint(workflow_id=agent, agent=agent, steps={agent: steps}, fixed_prefix=None)
        turn(cache, prompt, [1], AgentRequest(prompt, hint, fixed_prefix_tokens=16))
    cache.evict_device(cache.device.used_count - 24 - 16)  # room for exactly two of the three
    assert on_device(cache, near) == 16 and on_device(cache, CONVERSATION) == 24 and on_device(cache, far) == 0
    cache.evict_device(1)
    assert on_device(cache, near) == 16 and on_device(cache, CONVERSATION) == 0


def test_a_namespace_s_continuations_count_toward_its_cap(make_cache):
    cache = paused_cache(make_cache, namespace_cap_tokens=16)  # below the 24-token conversation
    cache.pause(SESSION, ["search"])
    ref = cache.intake.continuations.get(SESSION).ref
    assert cache.hints.raw_steps(ref) < math.inf and cache.hints.steps(ref) == math.inf
    assert cache.hints.protected_tokens("default") == 0


def test_tool_durations_are_a_bounded_per_namespace_mean_and_quantile_with_a_cold_default():
    durations = ToolDurations(default_s=2.0, max_tools=2, cold_hold_s=30.0)
    assert durations.estimate("ns", ["search"]) == (2.0, 30.0, ())
    for seconds in range(1, 11):
        durations.observe("ns", "search", seconds / 10)
    search = durations.estimate("ns", ["search"])
    assert search.expected_s == pytest.approx(0.55)  # the mean of 0.1..1.0 ranks
    assert search.hold_s == pytest.approx(hold_for(1.0))  # its 0.9 quantile keeps
    assert durations.estimate("other", ["search"]).expected_s == 2.0  # per namespace
    durations.observe("ns", "shell", 20.0)
    assert durations.estimate("ns", ["search", "shell"]) == (20.0, hold_for(20.0), (20.0,))  # the slowest tool
    for _ in range(TOOL_WINDOW):
        durations.observe("ns", "shell", 0.5)
    assert durations.estimate("ns", ["shell"]).expected_s == 0.5  # only the recent window counts
    durations.observe("ns", "third", 1.0)
    assert len(durations) == 2 and durations.estimate("ns", ["search"]).expected_s == 2.0  # the oldest forgotten


def test_resident_returns_go_first_and_nobody_is_passed_over_without_bound():
    from backends.kvcache import MAX_PASSED, admission_order, passed_over

    class Waiting:
        def __init__(self, name, returning):
            self.name, self.returning, self.passed = name, returning, 0

    old, back, new = Waiting("old", False), Waiting("back", True), Waiting("new", False)
    queue = [old, back, new]
    order = admission_order(queue, lambda w: w.returning, lambda w: w.passed)
    assert [w.name for w in order] == ["back", "old", "new"]
    assert passed_over(queue, back) == [old]
    old.passed = MAX_PASSED  # passed over too often: plain arrival order until it is in
    assert [w.name for w in admission_order(queue, lambda w: w.returning, lambda w: w.passed)] == ["old", "back", "new"]


def test_a_paused_hinted_agent_s_own_steps_are_deferred_to_its_continuation_s(make_cache):
    cache = make_cache(device_tokens=64)
    hint = KVFlowHint(workflow_id="w", agent="coder", steps={"coder": 0, "qa": 1})
    turn(cache, CONVERSATION[:20], [1, 2], AgentRequest(CONVERSATION[:20], hint, fixed_prefix_tokens=8))
    cache.intake.continuations.step_s = 1.0
    assert cache.hints.steps(("default", "coder")) == 0
    cache.pause(("default", "w/coder"), [], resume_in_s=6.0)
    assert cache.hints.steps(("default", "coder")) == 6.0 and cache.hints.steps(("default", "qa")) == 1
    cache.accept(AgentRequest(CONVERSATION, hint))  # the return's hint says it runs now again
    assert cache.hints.steps(("default", "coder")) == 0


def test_as_the_pause_runs_the_time_left_ranks_the_conversation(make_cache, clock):
    cache = paused_cache(make_cache)
    cache.intake.continuations.step_s = 1.0
    cache.pause(SESSION, [], resume_in_s=10.0)
    ref = cache.intake.continuations.get(SESSION).ref
    assert cache.hints.steps(ref) == 10.0
    clock.now += 0.5
    cache.expire()
    assert cache.hints.steps(ref) == 10.0  # less than a step closer: no re-keying yet
    clock.now += 3.5
    cache.expire()
    assert cache.hints.steps(ref) == 6.0
    clock.now += 8.0  # overdue but within the deadline's slack: due now
    cache.expire()
    assert cache.hints.steps(ref) == 0.0


# ---- the four policy causes issue 24's benchmark found (each failed before its fix) -----------
def test_a_tool_never_observed_is_kept_long_enough_for_a_slow_tool_s_first_run(make_cache, clock):
    """A slow tool (5-30 s) is cut off by the 2 s expected of an unknown tool no more: the cold
    deadline is tool_cold_hold_s (30 s); the 2 s only ranks it."""
    cache = paused_cache(make_cache)
    cache.pause(SESSION, ["build"])
    kept = cache.intake.continuations.get(SESSION)
    assert kept.deadline - kept.paused_at == pytest.approx(30.0) and kept.expected_s == 2.0
    clock.now += 20.0
    pressure(cache, 1000)
    decision = cache.accept(AgentRequest(CONVERSATION + [7], session="user-7"))
    assert decision.resumes and on_device(cache, CONVERSATION) == 24
    assert cache.intake.counters["continuations_expired"] == 0


def test_a_returned_conversation_ranks_as_running_until_its_call_ends(make_cache, clock):
    """Its return arrived: the conversation runs now (0 steps), whatever its pause's rank was, so a
    fixed prompt five steps away goes before it while the return waits to be admitted."""
    cache = paused_cache(make_cache)
    cache.intake.continuations.step_s = 1.0
    cache.pause(SESSION, [], resume_in_s=50.0)
    ref = cache.intake.continuations.get(SESSION).ref
    assert cache.hints.steps(ref) == 50.0
    near = [7] * 16
    hint = KVFlowHint(workflow_id="near", agent="near", steps={"near": 5})
    turn(cache, near, [1], AgentRequest(near, hint, fixed_prefix_tokens=16))
    clock.now += 1.0
    assert cache.accept(AgentRequest(CONVERSATION + [7], session="user-7")).resumes
    assert cache.hints.steps(ref) == 0
    cache.evict_device(16)
    assert on_device(cache, CONVERSATION) == 24 and on_device(cache, near) == 0


def test_the_rank_is_the_expected_pause_and_the_deadline_its_quantile(make_cache):
    """A tool back in 1 s nine times in ten and in 11 s once: expected back in 2 s (2 steps), kept
    for the 11 s quantile."""
    cache = paused_cache(make_cache)
    continuations = cache.intake.continuations
    continuations.step_s = 1.0
    for seconds in [1.0] * 9 + [11.0]:
        continuations.durations.observe("default", "search", seconds)
    cache.pause(SESSION, ["search"])
    kept = continuations.get(SESSION)
    assert cache.hints.steps(kept.ref) == 2.0
    assert kept.deadline - kept.paused_at == pytest.approx(11.0 * DEADLINE_SLACK + DEADLINE_GRACE_S)


def test_an_overdue_pause_sinks_below_those_due_soon(make_cache, clock):
    """Past every observed pause of its tool, a conversation is expected to last as long again as
    it ran: it ranks far, not as due now."""
    cache = paused_cache(make_cache)
    continuations = cache.intake.continuations
    continuations.step_s = 1.0
    for seconds in (1.0, 2.0, 3.0):
        continuations.durations.observe("default", "search", seconds)
    cache.pause(SESSION, ["search"])
    kept = continuations.get(SESSION)
    # 2 s expected; at 2.5 s, a quarter of the mass (spread over the 2-3 s gap) is left, 0.25 s on average
    assert kept.remaining_s(0.0) == pytest.approx(2.0) and kept.remaining_s(2.5) == pytest.approx(0.25)
    clock.now += 4.0  # past every observed pause (its deadline is 3 s x 1.5 + 1 s)
    cache.expire()
    assert cache.hints.steps(kept.ref) == 4.0


def test_a_paused_agent_s_fixed_prefix_counts_once_in_its_namespace_s_cap(make_cache):
    """The conversation's first 16 tokens are the agent's fixed prefix: agent and conversation
    hold 24 tokens, within a 24-token cap (counted twice, 40, the conversation lost protection)."""
    def paused_agent(cap: int):
        cache = make_cache(device_tokens=64, namespace_cap_tokens=cap)
        hint = KVFlowHint(workflow_id="w", agent="coder")
        request = AgentRequest(CONVERSATION[:20], hint, fixed_prefix_tokens=16)
        turn(cache, CONVERSATION[:20], CONVERSATION[20:] + [0], request)
        cache.pause(("default", "w/coder"), ["search"])
        return cache, cache.intake.continuations.get(("default", "w/coder")).ref

    cache, ref = paused_agent(24)
    assert cache.hints.steps(ref) < math.inf and cache.hints.steps(("default", "coder")) < math.inf
    assert cache.hints.protected_tokens("default") == 24
    tight, ref = paused_agent(23)  # one token less: the conversation is out
    assert tight.hints.steps(ref) == math.inf and tight.hints.protected_tokens("default") == 16


def test_the_mean_residual_life_of_the_observed_pauses_is_continuous_and_that_of_their_spread():
    """Evenly spread pauses of 5-30 s: the rest expected after 15 s is the uniform's, (30 - 15) / 2,
    and passing an observed pause moves it by little (the samples' own step CDF jumps there: the
    mean of those above 14.9 s is 22.5 s, of those above 15.1 s 25 s)."""
    spread = (5.0, 10.0, 15.0, 20.0, 25.0, 30.0)
    assert mean_residual_s(spread, 0.0) == pytest.approx(17.5)
    assert mean_residual_s(spread, 15.0) == pytest.approx(7.5)
    assert mean_residual_s(spread, 14.9) - mean_residual_s(spread, 15.1) == pytest.approx(0.1)
    assert mean_residual_s((4.0,), 1.0) == 3.0  # one observation: it is the pause


def test_of_two_paused_conversations_the_older_stays_when_both_outlast_an_observed_pause_but_one(make_cache, clock):
    """A tool observed at 5, 10, ..., 30 s. Conversation A paused 0.2 s before B; 15.1 s into A's
    pause (14.9 s into B's), A is the sooner back (7.45 s left against 7.55 s), so B goes first.
    Counting only the observed pauses above each, A's rest was 25 - 15.1 = 9.9 s and B's
    22.5 - 14.9 = 7.6 s: the older ranked farther the moment it passed the 15 s observation."""
    cache = make_cache(device_tokens=64)
    continuations = cache.intake.continuations
    continuations.step_s = 1.0
    for seconds in (5.0, 10.0, 15.0, 20.0, 25.0, 30.0):
        continuations.durations.observe("default", "build", seconds)
    a, b = CONVERSATION, [t + 100 for t in CONVERSATION]
    for key, conversation in (("a", a), ("b", b)):
        turn(cache, conversation[:20], conversation[20:] + [0], AgentRequest(conversation[:20], session=key))
        cache.pause(("default", key), ["build"])
        clock.now += 0.2
    clock.now += 15.1 - 0.4
    cache.expire()
    cache.evict_device(24)
    assert on_device(cache, a) == 24 and on_device(cache, b) == 0
