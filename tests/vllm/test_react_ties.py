"""ReAct agents on vLLM's real scheduler and block pool (no model, no server), the shape of
``benchmarks/vllm_react.py``: each agent is a one-agent workflow at 0 steps, and calls overlap.
Among such agents the one whose call ended last keeps its fixed prompt (LRU): the workflow that
advanced last is not the one needed last once every workflow has reached its agent
(benchmarks/results/react-tools/vllm/plain-vs-lru.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eviction_spec import BLOCK, Setup
from kvflow_orch.protocol import KVFlowHint
from vllm_server import HAVE_VLLM, SKIP_REASON

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)]

FIXED_BLOCKS, POOL_BLOCKS = 2, 8


def _fixed(agent: int) -> list[int]:
    return [1000 * (agent + 1) + i for i in range(FIXED_BLOCKS * BLOCK)]


def _hint(agent: str) -> KVFlowHint:
    return KVFlowHint(workflow_id=f"job-{agent}", namespace="ns", agent=agent, steps={agent: 0}, fixed_prefix=1)


def test_zero_steps_agents_keep_the_fixed_prompt_used_last(tmp_path: Path) -> None:
    from eviction_vllm import VLLMHost

    session = VLLMHost(tmp_path).open(Setup(device_tokens=POOL_BLOCKS * BLOCK, namespace_cap_tokens=None,
                                            host_tokens=0))
    a, b = _fixed(0), _fixed(1)
    call_a, _ = session.start(a + [50 + i for i in range(BLOCK // 2)], _hint("A"), len(a))
    call_b, _ = session.start(b + [60 + i for i in range(BLOCK // 2)], _hint("B"), len(b))
    session.finish(call_a)  # A pauses on its tool first; B's call ends after: B is the one used last
    session.finish(call_b)
    # Room for one of the two fixed prompts only next to a plain request.
    session.request([90_000 + i for i in range((POOL_BLOCKS - FIXED_BLOCKS) * BLOCK - 1)], None, None)
    held = {"A": session.held(a, any_tier=False), "B": session.held(b, any_tier=False)}
    session.close()
    assert held == {"A": 0, "B": len(b)}
