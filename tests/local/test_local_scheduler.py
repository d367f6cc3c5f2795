"""Status-aware scheduling, driven step by step on the real scheduler: a request whose cached prefix
is still loading is skipped and a ready request runs; once the load completes it runs and its greedy
tokens equal those computed from scratch."""

from __future__ import annotations

from backends.base import GenerateRequest, SamplingParams, StreamEvent
from backends.local import EngineConfig
from backends.local.request import Phase, RequestState
from backends.local.scheduler import Scheduler
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

ROLE = {a: f"You are the {a}. Follow your written instructions exactly and keep answers short. " * 3
        for a in ("planner", "coder", "critic")}


def request(tiny, agent, question="Do the next step.", **steps):
    messages = [{"role": "system", "content": ROLE[agent]}, {"role": "user", "content": question}]
    enc = tiny.tokenizer.encode_chat(messages, 1)
    hint = KVFlowHint(workflow_id="wf", agent=agent, steps=steps) if steps else None
    return GenerateRequest(enc.input_ids, SamplingParams(max_tokens=8, ignore_eos=True), hint=hint,
                           fixed_prefix_tokens=enc.fixed_prefix_tokens)


def submit(sched, tiny, req):
    events: list = []
    state = RequestState(req, events.append, tiny.tokenizer, None)
    sched.submit(state)
    return state, events


def run_all(sched):
    while sched.has_work():
        sched.step()


def output(events):
    last = events[-1]
    assert isinstance(last, StreamEvent) and last.result is not None, last
    return last.result.output_ids


def test_loading_prefix_is_skipped_and_ready_requests_run(tiny):
    scratch = Scheduler(EngineConfig.build(device_tokens=4096, host_tokens=0), tiny, wake=lambda: None)
    _, ref_events = submit(scratch, tiny, request(tiny, "planner"))
    run_all(scratch)
    reference = output(ref_events)

    sched = Scheduler(EngineConfig.build(device_tokens=700, host_tokens=4096, policy="kvflow"), tiny, wake=lambda: None)
    try:
        submit(sched, tiny, request(tiny, "planner", planner=0))
        run_all(sched)
        for agent in ("coder", "critic"):
            submit(sched, tiny, request(tiny, agent, planner=None, **{agent: 0}))
            run_all(sched)
        # plan the prefetch ourselves and hold its copies: the planner's prefix stays "loading"
        sched.cache.apply_steps(StepsUpdate(workflow_id="wf", steps={"planner": 1}))
        plan = sched.cache.plan_prefetch()
        assert plan.tasks, "the planner's fixed prefix should be planned for prefetch"
        sched.tiers.demote(plan.evicted)

        planner, planner_events = submit(sched, tiny, request(tiny, "planner"))
        coder, coder_events = submit(sched, tiny, request(tiny, "coder", "Another step."))
        sched.step()
        assert planner.phase is Phase.WAITING and coder.phase is not Phase.WAITING
        while coder.phase is not Phase.DONE:
            sched.step()
        assert planner.phase is Phase.WAITING and not planner_events

        for task in plan.tasks:
            sched.tiers.load_now(task)
        run_all(sched)
        assert output(planner_events) == reference
        assert sched.snapshot["prefetch_hit_tokens"] > 0
        assert sched.cache.check_integrity() and sched.snapshot["device_held"] == 0
        assert len(output(coder_events)) == 8
    finally:
        sched.shutdown()
        scratch.shutdown()


ADMISSION_COUNTERS = ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens", "recomputed_tokens")


def test_a_request_that_does_not_fit_yet_is_not_readmitted_every_step(tiny):
    # Two requests fill the 600-slot pool (100 prompt + 199 decode slots each); the third must wait.
    # Retrying its admission on every step ran the brain's admit each time, counting its prompt again.
    sched = Scheduler(EngineConfig.build(device_tokens=600, host_tokens=0), tiny, wake=lambda: None)
    try:
        prompts = [tuple((7 * i + k) % 250 + 3 for k in range(100)) for i in range(3)]
        states = [submit(sched, tiny, GenerateRequest(p, SamplingParams(max_tokens=200, ignore_eos=True)))[0]
                  for p in prompts]
        sched.step()
        assert [s.phase is Phase.WAITING for s in states] == [False, False, True]
        counted = sum(sched.snapshot[k] for k in ADMISSION_COUNTERS)
        for _ in range(10):
            sched.step()
        assert states[2].phase is Phase.WAITING
        assert sum(sched.snapshot[k] for k in ADMISSION_COUNTERS) == counted
        run_all(sched)  # once the first two end, the third runs to completion
        assert all(s.phase is Phase.DONE for s in states) and len(states[2].outputs) == 200
        assert sum(sched.snapshot[k] for k in ADMISSION_COUNTERS) <= 2 * sum(len(p) for p in prompts)
    finally:
        sched.shutdown()


def test_a_resident_continuation_s_return_is_admitted_ahead_of_new_sessions(tiny):
    """max_batch 1: one admission per free slot. The paused agent's return, queued behind two new
    sessions, runs first while its conversation is on device; its greedy tokens equal a cold run's."""
    def plain(question: str, session: str) -> GenerateRequest:
        enc = tiny.tokenizer.encode_chat([{"role": "user", "content": question}], None)
        return GenerateRequest(enc.input_ids, SamplingParams(max_tokens=8, ignore_eos=True), session=session)

    first = plain("Look the weather up, then answer.", "agent-a")
    scratch = Scheduler(EngineConfig.build(device_tokens=4096, host_tokens=0), tiny, wake=lambda: None)
    sched = Scheduler(EngineConfig.build(device_tokens=4096, host_tokens=0, max_batch=1), tiny, wake=lambda: None)
    try:
        _, events = submit(sched, tiny, first)
        run_all(sched)
        back_ids = first.input_ids + output(events) + tuple(tiny.tokenizer.encode("rain, 12 C"))
        back = GenerateRequest(back_ids, SamplingParams(max_tokens=8, ignore_eos=True), session="agent-a")
        sched.pause(first, ("get_weather",))
        newcomers = [submit(sched, tiny, plain(f"New question {i}?", f"new-{i}"))[0] for i in range(2)]
        returning, back_events = submit(sched, tiny, back)
        sched.step()  # drains the inbox (pause, three arrivals) and admits one request
        assert returning.intake.resumes and returning.phase is not Phase.WAITING
        assert all(s.phase is Phase.WAITING and s.passed_over == 1 for s in newcomers)
        run_all(sched)
        assert sched.snapshot["continuations_kept"] == sched.snapshot["continuations_reused"] == 1
        _, cold = submit(scratch, tiny, back)
        run_all(scratch)
        assert output(back_events) == output(cold)
    finally:
        sched.shutdown()
        scratch.shutdown()
