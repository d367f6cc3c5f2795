"""``Engine.flush_cache`` on tiny-random: an idle flush empties both pools and the next identical
prompt is computed from scratch with the same greedy tokens; a flush while a request runs is
refused with :class:`EngineBusy` and changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from backends.base import EngineBusy
from test_local_engine import assert_no_leak, chat, make_engine, wait_idle


async def test_idle_flush_empties_both_pools_and_keeps_greedy_output() -> None:
    engine = make_engine(device_tokens=640, host_tokens=2048)
    try:
        first = await engine.generate(chat(engine, "planner", "Plan a party.", steps={"planner": 0}))
        for agent in ("coder", "critic"):  # the small device pool pushes some KV to host
            await engine.generate(chat(engine, agent, "Review the plan."))
        hit = await engine.generate(chat(engine, "planner", "Plan a party."))
        assert hit.cached_tokens > 0
        stats = wait_idle(engine)
        assert stats["device_used"] > 0 and stats["host_used"] > 0
        freed = await engine.flush_cache()
        assert (freed.device_tokens, freed.host_tokens) == (stats["device_used"], stats["host_used"])
        stats = engine.stats()
        assert stats["device_used"] == stats["host_used"] == stats["nodes"] == 0
        assert engine.scheduler.cache.hints.workflow_count == 1  # the workflow's steps stay
        assert_no_leak(engine)
        again = await engine.generate(chat(engine, "planner", "Plan a party."))
        assert again.cached_tokens == 0
        assert again.output_ids == hit.output_ids == first.output_ids
        assert_no_leak(engine)
    finally:
        engine.close()


async def test_flush_while_a_request_runs_is_refused_and_changes_nothing() -> None:
    engine = make_engine()
    try:
        reference = await engine.generate(chat(engine, "coder", "Write it.", max_tokens=1000))
        running = asyncio.create_task(engine.generate(chat(engine, "coder", "Write it.", max_tokens=1000)))
        while not engine.stats()["running"]:
            await asyncio.sleep(0.005)
        used = engine.stats()["device_used"]
        with pytest.raises(EngineBusy, match="1 running and 0 waiting requests"):
            await engine.flush_cache()
        assert engine.stats()["device_used"] >= used
        result = await running
        assert result.output_ids == reference.output_ids and result.cached_tokens > 0
        assert (await engine.flush_cache()).device_tokens > 0
        assert_no_leak(engine)
    finally:
        engine.close()
