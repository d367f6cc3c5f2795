"""A prefetch that fails mid-copy. INJECTED FAULT: the engine's ``load_copy`` seam gets a copy function
that moves the first half of the task's rows host->device and then raises, as a failing DMA would.

Expected: the brain's ``fail_load`` puts the nodes back to host-only (nothing half-loaded is ever
served), the next request for that prefix reloads it from host (or recomputes), its greedy output is
identical to a fresh engine's, and no slot, lock or in-flight load is left behind."""

from __future__ import annotations

import asyncio
import time

from backends.base import GenerateRequest, SamplingParams
from backends.local.pools import copy_slots
from kvflow_live import tiny_engine
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

ROLES = {
    "planner": "You are the planner. Break the goal into numbered steps with owners and deadlines. " * 4,
    "coder": "You are the coder. Write small, tested functions and explain each change briefly. " * 4,
    "critic": "You are the critic. Point out risks, missing tests and unclear names, most severe first. " * 4,
}
MAX_TOKENS = 12


def request(engine, agent: str, user: str, steps: dict) -> GenerateRequest:
    messages = [{"role": "system", "content": ROLES[agent]}, {"role": "user", "content": user}]
    encoded = engine.tokenizer.encode_chat(messages, fixed_messages=1)
    hint = KVFlowHint(workflow_id="wf-fault", agent=agent, steps=steps, fixed_prefix=1)
    return GenerateRequest(encoded.input_ids, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), hint,
                           encoded.fixed_prefix_tokens)


async def _until(predicate, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_prefetch_failing_mid_copy_falls_back_to_host_with_identical_output() -> None:
    fresh = tiny_engine()
    reference = await fresh.generate(request(fresh, "planner", "Plan a trip.", {"planner": 0}))
    longest = max(len(request(fresh, a, "Review the plan.", {}).input_ids) for a in ROLES)
    fresh.close()

    injected: list[object] = []

    def failing_copy(task) -> None:  # the injected fault (see the module docstring)
        half = len(task.host_slots) // 2
        sched = engine.scheduler
        copy_slots(sched.host_pool, task.host_slots[:half], sched.device_pool, task.device_slots[:half])
        injected.append(task)
        raise RuntimeError("injected fault: host->device copy failed mid-way")

    # Room for two agents' requests, not three: the third pushes the planner's prefix to host.
    engine = tiny_engine(device_tokens=int(2.5 * (longest + MAX_TOKENS)), host_tokens=4096, policy="kvflow",
                         load_copy=failing_copy)
    try:
        await engine.generate(request(engine, "planner", "Plan a trip.", {"planner": 0}))
        for agent in ("coder", "critic"):
            await engine.generate(request(engine, agent, "Review the plan.", {"planner": None, agent: 0}))
        planner_ids = request(engine, "planner", "x", {}).input_ids
        fixed = request(engine, "planner", "x", {}).fixed_prefix_tokens
        on_host = await engine.inspect_cache(lambda c: c.match_prefix(planner_ids[:fixed]).host_tokens)
        assert on_host > 0, "setup: the planner's prefix should have been demoted to host"

        # The planner is next: the brain plans a prefetch, whose copy fails half-way.
        engine.apply_steps(StepsUpdate(workflow_id="wf-fault", steps={"planner": 1, "coder": None, "critic": None}))
        await _until(lambda: injected and engine.stats()["loads_in_flight"] == 0, "the failed load to be settled")
        after_fail = await engine.inspect_cache(
            lambda c: (c.match_prefix(planner_ids[:fixed]), c.check_integrity()))
        match, ok = after_fail
        assert ok and match.host_tokens > 0, "fail_load must leave the prefix host-only"
        assert all(node.loading is None for node in match.nodes)

        before = engine.stats()
        again = await engine.generate(request(engine, "planner", "Plan a trip.", {"planner": 0}))
        stats = engine.stats()
        assert again.output_ids == reference.output_ids
        assert stats["prefetch_hit_tokens"] == before["prefetch_hit_tokens"]  # nothing failed was served as prefetched
        reused = stats["host_hit_tokens"] - before["host_hit_tokens"]
        recomputed = stats["recomputed_tokens"] - before["recomputed_tokens"]
        assert reused > 0 or recomputed >= fixed  # reloaded at admission, or computed again
        await _until(lambda: not any(engine.stats()[k] for k in ("device_held", "running", "waiting")), "idle")
        locked = await engine.inspect_cache(lambda c: (c.check_integrity(), sum(n.lock_ref > 0 for n in c.tree)))
        assert locked == (True, 0)
    finally:
        engine.close()
