"""Orchestrator overhead per LLM call on a 100-agent workflow (target: < 0.5 ms).

    python benchmarks/orch_overhead.py [--agents 100] [--repeat 2000]

Measured side by side in one run:

* hint building: one tracker transition (the running node finishes, the next starts, so the steps
  are solved again) plus the hint builder every driver uses (``WorkflowHints.hint``: agent_steps()
  for all agents, KVFlowHint validation), walking round the 100-agent sequential loop;
* injection: ``attach_hint`` into an OpenAI chat body plus the JSON encoding the HTTP client does;
* whole runtime per call: a full ``arun`` of the workflow (task start, state snapshot, router, merge,
  hint, trace record) against a client that answers instantly, divided by the number of calls, so
  no model or network time is included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from kvflow_orch.clients.base import LLMClient, LLMReply
from kvflow_orch.protocol import attach_hint
from kvflow_orch.hinting import WorkflowHints
from kvflow_orch.runtime import arun
from workflows.synthetic import synthetic

TARGET_MS = 0.5


class InstantClient(LLMClient):
    """Answers at once, so the measurement holds only the orchestrator's own work."""

    name = "instant"

    @property
    def supports_hints(self) -> bool:
        return True

    async def chat(self, messages, sampling, hint):
        return LLMReply("ok", 1, 1, 0)

    def send_steps(self, update) -> None:
        pass

    async def flush(self, timeout: float = 5.0) -> None:
        pass


def _timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _row(name: str, samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    med = statistics.median(samples)
    return f"{name:<34} {med:9.4f} {p99:9.4f}   {'yes' if med < TARGET_MS else 'NO'}"


def main() -> None:
    parser = argparse.ArgumentParser(description="orchestrator overhead per LLM call")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()

    wf = synthetic(n_agents=args.agents, fixed=64, dynamic=8, output=4, rounds=1)
    asg = wf.compile()
    tracker, hints = asg.tracker(), WorkflowHints("bench-wf", "bench")
    names = [f"s{i:02d}" for i in range(args.agents)]
    position = [0]
    tracker.start(names[0])

    def build() -> None:
        i = position[0]
        nxt = (i + 1) % len(names)
        tracker.finish(names[i], goto=names[nxt] if nxt == 0 else None)  # the last stage loops back
        tracker.start(names[nxt])
        position[0] = nxt
        hints.hint(tracker, names[nxt], fixed_prefix=1)

    build()
    hint = hints.hint(tracker, names[position[0]], fixed_prefix=1)
    body = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            "max_tokens": 4}

    def inject() -> None:
        json.dumps(attach_hint(body, hint))

    build_ms = _timed(build, args.repeat)
    inject_ms = _timed(inject, args.repeat)
    both_ms = [a + b for a, b in zip(build_ms, inject_ms, strict=True)]

    async def whole() -> float:
        client = InstantClient()
        t = time.perf_counter()
        result = await arun(wf, {}, backend=client)
        return (time.perf_counter() - t) * 1e3 / len(result.calls)

    per_call = [asyncio.run(whole()) for _ in range(max(5, args.repeat // 200))]

    print(f"orchestrator overhead per LLM call, {args.agents}-agent sequential workflow "
          f"(hint carries {len(hint.steps)} agents' steps)")
    print(f"{'measure':<34} {'median ms':>9} {'p99 ms':>9}   < {TARGET_MS} ms")
    print(_row("hint building (steps + KVFlowHint)", build_ms))
    print(_row("injection (attach_hint + JSON)", inject_ms))
    print(_row("hint building + injection", both_ms))
    print(_row("whole runtime per call (no model)", per_call))


if __name__ == "__main__":
    main()
