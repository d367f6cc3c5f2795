"""Replay of a ``kvflow run --record`` trace (format: :mod:`kvflow_orch.protocol.trace`).

Each recorded workflow becomes one client that re-issues its calls with the recorded hints (so
steps are exactly those the orchestrator sent) and recorded token counts, synthetic token ids:
each (namespace, agent) owns a fixed prefix of ``fixed_tokens`` random ids (0 when the backend did
not report it: the whole prompt is then dynamic), and each call appends a fresh dynamic suffix.

Dependencies are inferred from time: a call waits for every call of its workflow that had ended
before it was sent, and then for the recorded gap after the last of them (orchestrator and
plain-node time); calls with no such predecessor are sent at their recorded offset.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from kvflow_orch.protocol import CallRecord, KVFlowHint, StepsUpdate, read_calls

from .serving import ServingSim, SimRequest
from .orchestrator import WarmingClient
from .workloads import Workload, random_tokens

__all__ = ["TraceCall", "TraceInstance", "load_trace", "TraceClient"]

_EPS = 1e-6


@dataclass(frozen=True)
class TraceCall:
    agent: str
    prompt_tokens: int
    completion_tokens: int
    hint: KVFlowHint | None
    deps: tuple[int, ...]
    delay_s: float
    recorded_s: float


@dataclass(frozen=True)
class TraceInstance:
    workflow_id: str
    namespace: str
    fixed: Mapping[str, tuple[int, ...]]
    calls: tuple[TraceCall, ...]
    seed: int
    start_s: float = 0.0
    recorded_s: float = 0.0


def _calls_of(records: list[CallRecord]) -> tuple[TraceCall, ...]:
    records = sorted(records, key=lambda r: r.offset_s)
    first = records[0].offset_s  # the instance starts when its first call is sent
    out = []
    for j, rec in enumerate(records):
        ended = [(k, r.offset_s + r.duration_s) for k, r in enumerate(records[:j])
                 if r.offset_s + r.duration_s <= rec.offset_s + _EPS]
        deps = tuple(k for k, _ in ended)
        delay = rec.offset_s - max((end for _, end in ended), default=first)
        hint = KVFlowHint.model_validate(rec.hint) if rec.hint else None
        out.append(TraceCall(rec.agent, rec.prompt_tokens, max(1, rec.completion_tokens), hint, deps,
                             max(0.0, delay), rec.duration_s))
    return tuple(out)


def load_trace(path: str | Path, seed: int = 0) -> Workload:
    """Read a record file into a workload of :class:`TraceInstance` (one per workflow id)."""
    by_wf: dict[tuple[str, str], list[CallRecord]] = defaultdict(list)
    for rec in read_calls(path):
        by_wf[(rec.namespace, rec.workflow_id)].append(rec)
    if not by_wf:
        raise ValueError(f"{path}: the trace holds no calls")
    t0 = min(r.time for recs in by_wf.values() for r in recs)
    rng = random.Random(seed)
    fixed_len: dict[tuple[str, str], int] = {}
    for (ns, _), recs in by_wf.items():
        for r in recs:
            key = (ns, r.agent)
            fixed = r.fixed_tokens if r.fixed_tokens is not None else 0
            fixed_len[key] = min(fixed_len.get(key, fixed), fixed, r.prompt_tokens)
    prefixes = {key: random_tokens(rng, n) for key, n in sorted(fixed_len.items())}
    instances = []
    for (ns, wf), recs in sorted(by_wf.items()):
        start = min(r.time for r in recs) - t0
        first = min(r.offset_s for r in recs)
        end = max(r.offset_s + r.duration_s for r in recs)
        fixed = {agent: prefixes[(ns, agent)] for agent in sorted({r.agent for r in recs})}
        instances.append(TraceInstance(wf, ns, fixed, _calls_of(recs), rng.randrange(2**31),
                                       start_s=start, recorded_s=end - first))
    calls = sum(len(i.calls) for i in instances)
    labels = {"workflows": len(instances), "calls": calls, "instances": len(instances),
              "fixed": max((len(t) for t in prefixes.values()), default=0), "dynamic": "rec", "output": "rec",
              "recorded_s": sum(i.recorded_s for i in instances) / len(instances)}
    return Workload(f"replay:{Path(path).name}", tuple(instances), labels)


class TraceClient(WarmingClient):
    """Re-issues one recorded workflow's calls, each once its inferred predecessors finished."""

    def __init__(self, inst: TraceInstance, sim: ServingSim, on_end: Callable[["TraceClient"], None]) -> None:
        self.inst = inst
        self.sim = sim
        self.on_end = on_end
        self.rng = random.Random(inst.seed)
        self.calls = 0
        self.start_s = 0.0
        self.end_s = 0.0
        self._finished_calls = 0
        # Calls still awaited by each call, and who awaits each call: a finish touches only its
        # dependents instead of rescanning every call's dependency list.
        self._awaiting = [len(call.deps) for call in inst.calls]
        self._dependents: list[list[int]] = [[] for _ in inst.calls]
        for j, call in enumerate(inst.calls):
            for d in call.deps:
                self._dependents[d].append(j)
        self.requests: dict[int, SimRequest] = {}
        """Measured calls by index in ``inst.calls``."""

    def warm_agents(self) -> list[str]:
        return sorted(a for a, t in self.inst.fixed.items() if t)

    def warm_request(self, agent: str, on_done: Callable[[SimRequest], None]) -> SimRequest:
        hint = next((c.hint for c in self.inst.calls if c.agent == agent), None)
        return self._request(agent, len(self.inst.fixed[agent]) + 1, 1, hint, on_done)

    def start(self) -> None:
        self.start_s = self.sim.events.now
        self._release(i for i, waiting in enumerate(self._awaiting) if not waiting)

    def _release(self, ready: Iterable[int]) -> None:
        now = self.sim.events.now
        for i in ready:
            self.sim.events.schedule(now + self.inst.calls[i].delay_s, self._send, i)
        if self._finished_calls == len(self.inst.calls):
            self.end_s = now
            self.sim.steps_update(StepsUpdate(workflow_id=self.inst.workflow_id, namespace=self.inst.namespace,
                                              done=True))
            self.on_end(self)

    def _send(self, i: int) -> None:
        call = self.inst.calls[i]
        self.calls += 1
        request = self._request(call.agent, call.prompt_tokens, call.completion_tokens, call.hint,
                                lambda r, i=i: self._finished(i))
        self.requests[i] = request
        self.sim.submit(request)

    def _finished(self, i: int) -> None:
        self._finished_calls += 1
        ready = []
        for j in self._dependents[i]:
            self._awaiting[j] -= 1
            if not self._awaiting[j]:
                ready.append(j)
        self._release(ready)

    def _request(self, agent: str, prompt_tokens: int, output: int, hint: KVFlowHint | None,
                 on_done: Callable[[SimRequest], None]) -> SimRequest:
        fixed = self.inst.fixed.get(agent, ())[:prompt_tokens]
        prompt = fixed + random_tokens(self.rng, max(1, prompt_tokens - len(fixed)))
        return SimRequest(prompt, random_tokens(self.rng, output), (self.inst.namespace, agent), len(fixed),
                          hint, on_done)
