"""The paper's concurrent shape on vLLM's real scheduler and block pool (no model, no server):
two independent four-agent cycles in flight at once, their calls interleaved as
``benchmarks/vllm_kvflow.py --shapes paper`` runs them (``paper_x2``, scaled to 32-token blocks),
hints and steps updates as the runtime sends them. kvflow's hit tokens must equal the best online
bound of :mod:`backends.kvcache.block_replay` on the same requests: the equal-steps ties between
the two workflows are where LRU within a tie loses a whole prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.kvcache.block_replay import Request, block_bounds
from eviction_spec import BLOCK, Setup
from kvflow_orch.protocol import KVFlowHint, StepsUpdate
from vllm_server import HAVE_VLLM, SKIP_REASON

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)]

APPS, AGENTS, ROUNDS = 2, 4, 2
FIXED, DYNAMIC = 8 * BLOCK, 16  # a call: 8 full fixed blocks and a partial one (the paper: 32 and 1)
POOL_BLOCKS = 32  # two running calls hold 18, so 14 are left: under two fixed prefixes (the paper: 62 of 128)


def _calls() -> list[tuple[int, int, list[int]]]:
    """(app, agent, prompt) per call, in the order they are sent: the apps alternate."""
    out = []
    for n in range(APPS * AGENTS * ROUNDS):
        app, agent = n % APPS, (n // APPS) % AGENTS
        fixed = [1000 * (1 + app * AGENTS + agent) + i for i in range(FIXED)]
        out.append((app, agent, fixed + [20000 + 100 * n + i for i in range(DYNAMIC)]))
    return out


def _timeline(count: int) -> list[tuple[str, int]]:
    """Each app runs its calls one after another, the two apps overlapping: call n starts once
    call n - 2 (the same app's previous one) has finished."""
    events = [("start", 0), ("start", 1)]
    for n in range(2, count):
        events += [("end", n - 2), ("start", n)]
    return events + [("end", count - 2), ("end", count - 1)]


def _steps(agent: int) -> dict[str, float]:
    return {f"s{a}": float((a - agent) % AGENTS) for a in range(AGENTS)}


def test_two_concurrent_cycles_hit_the_best_online_bound(tmp_path: Path) -> None:
    from eviction_vllm import VLLMHost

    session = VLLMHost(tmp_path).open(Setup(device_tokens=POOL_BLOCKS * BLOCK, namespace_cap_tokens=None,
                                            host_tokens=0))
    calls = _calls()
    running, hits = {}, [0] * len(calls)
    for kind, n in _timeline(len(calls)):
        app, agent, prompt = calls[n]
        if kind == "end":
            session.finish(running.pop(n))
            continue
        if agent == 0 and n >= APPS * AGENTS:  # the runtime's update at a round's end
            session.apply_steps(StepsUpdate(workflow_id="w", namespace=f"app{app}", steps=_steps(0)))
        hint = KVFlowHint(workflow_id="w", namespace=f"app{app}", agent=f"s{agent}", steps=_steps(agent),
                          fixed_prefix=1)
        running[n], hits[n] = session.start(prompt, hint, FIXED)
    session.close()
    requests = [Request(prompt, 1, FIXED, 2 * n, 2 * n + 3) for n, (_, _, prompt) in enumerate(calls)]
    bounds = block_bounds(requests, POOL_BLOCKS, BLOCK)
    assert bounds["best_online"] > bounds["lru"]  # the shape leaves eviction a choice
    assert sum(hits) == bounds["best_online"], f"per call: {hits}; bounds: {bounds}"
