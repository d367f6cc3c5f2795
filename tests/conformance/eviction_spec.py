"""The eviction-order conformance spec: its vocabulary, the host interface, and the player that
drives any host through a scenario (the table of scenarios is :mod:`eviction_scenarios`).

Every host that runs the cache brain's order (``backends.kvcache.KVCache`` itself, the SGLang
plugin on SGLang's radix cache, the vLLM plugin on vLLM's block pool) must keep the same agents'
fixed prefixes under the same pressure. A scenario is written in *blocks* of :data:`BLOCK` tokens,
the unit every host can express (vLLM caches and evicts whole blocks, SGLang and the brain any
number of tokens), and its expectation is *which prompts survive*, never slot ids or node shapes.

Vocabulary:

* a **segment** is a named block of tokens; a scenario's ``prompts`` map a *label* (an agent, or a
  plain request's name) to the segments its requests start with. For an agent that is its fixed
  prefix; ``sys`` shared by several agents is a prefix they share.
* :class:`Call` is one request: the label's segments, optional named ``dynamic`` segments, then
  fresh suffix blocks (never seen again). With ``steps`` it carries a kvflow hint whose declared
  fixed prefix is the label's segments (or none, for the host to infer); without, it is a plain
  request.
* :class:`Steps` is an out-of-band steps update (``done`` forgets the workflow).
* :class:`Pressure` is a plain request of fresh blocks that must be admitted now: the host frees
  room by evicting in its order, exactly as it does for any request, and caches it.
* :class:`EvictHost` asks the host tier to drop blocks (hosts with the ``host_tier`` capability).

After the ops, a label *survives* when the host still holds all of its segments: on device, or
(``tier="any"``) on device or host. Hosts lacking a capability a scenario requires skip it, naming
why; a host may also list scenarios where it knowingly departs from the brain (strict xfail, so
the entry must go when the host is fixed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal, Mapping, Protocol, Sequence, Union

from kvflow_orch.protocol import KVFlowHint, StepsUpdate

__all__ = [
    "BLOCK", "HOST_TIER", "NO_CAP", "StepMap", "Call", "Steps", "Pressure", "EvictHost", "Scenario", "Setup",
    "EvictionHost", "HostSession", "play",
]

BLOCK = 32
"""Tokens per block: the unit of every scenario, and the vLLM adapter's block size (the one vLLM's CPU
attention prefers, as the serving conformance suite's vLLM server uses)."""

HOST_TIER = "host_tier"
"""Capability: a host tier below the device pool, with its own eviction in the same order."""

NO_CAP = "no-cap"
"""A scenario's namespace cap when it should not matter: every host gets a cap of the whole pool."""

StepMap = Mapping[str, Union[float, None]]  # agent -> steps; None: not expected again


@dataclass(frozen=True)
class Call:
    """One request of ``who``: its prompt segments, ``dynamic`` segments, ``suffix`` fresh blocks.

    Hinted when ``steps`` is given (the hint's workflow steps; ``None`` values: not expected
    again). ``declared``: the hint declares the fixed prefix (the label's segments) in tokens;
    ``False`` leaves it to the host's segmentation (common prefix of the agent's requests)."""

    who: str
    steps: StepMap | None = None
    workflow: str = "wf"
    namespace: str = "ns"
    dynamic: tuple[str, ...] = ()
    suffix: int = 1
    declared: bool = True


@dataclass(frozen=True)
class Steps:
    """``POST /kvflow/v1/steps``: replace a workflow's steps, or forget it (``done``)."""

    steps: StepMap = field(default_factory=dict)
    workflow: str = "wf"
    namespace: str = "ns"
    done: bool = False


@dataclass(frozen=True)
class Pressure:
    """A plain request of ``blocks`` fresh blocks, admitted now (evicting what it must). It is
    cached like any plain request, so a later, larger pressure evicts it first."""

    blocks: int


@dataclass(frozen=True)
class EvictHost:
    """The host tier drops ``blocks`` blocks of host-only entries, in its order."""

    blocks: int


Op = Union[Call, Steps, Pressure, EvictHost]


@dataclass(frozen=True)
class Scenario:
    """``ops`` played on a pool of ``pool_blocks``; ``survivors`` are the labels of ``prompts``
    still held after them. ``rule`` names the rule a host breaks when it fails."""

    name: str
    rule: str
    pool_blocks: int
    prompts: Mapping[str, tuple[str, ...]]
    ops: tuple[Op, ...]
    survivors: frozenset[str]
    namespace_cap_blocks: int | None | Literal["no-cap"] = NO_CAP  # None: the host's default
    tier: Literal["device", "any"] = "device"
    requires: frozenset[str] = frozenset()

    @property
    def hinted(self) -> bool:
        return any(isinstance(op, Call) and op.steps is not None for op in self.ops)


@dataclass(frozen=True)
class Setup:
    """What a host is built with for one scenario (tokens; every host gets the same)."""

    device_tokens: int
    namespace_cap_tokens: int | None  # None: the host's own default
    host_tokens: int  # 0: no host tier


class HostSession(Protocol):
    """One freshly built host, driven through its public entry points."""

    def request(self, tokens: Sequence[int], hint: KVFlowHint | None, fixed_tokens: int | None) -> None:
        """Serve one request to completion: apply its hint, reuse its cached prefix, allocate
        the rest (evicting in the host's order), cache it, release it."""

    def apply_steps(self, update: StepsUpdate) -> None: ...

    def evict_host(self, tokens: int) -> None: ...

    def held(self, tokens: Sequence[int], *, any_tier: bool) -> int:
        """Leading tokens of ``tokens`` the host holds (device, or device + host)."""

    def close(self) -> None: ...


class EvictionHost(Protocol):
    name: str
    lacks: Mapping[str, str]  # capability -> why this host lacks it
    diverges: Mapping[str, str]  # scenario name -> the known departure from the brain

    def open(self, setup: Setup) -> HostSession: ...


# ---- the player ---------------------------------------------------------------------------
class _Tokens:
    """Token ids: one block per segment name (the same name, the same tokens), fresh blocks unique."""

    def __init__(self) -> None:
        self._segments: dict[str, list[int]] = {}
        self._next = itertools.count(1)

    def block(self) -> list[int]:
        return [next(self._next) for _ in range(BLOCK)]

    def fresh(self, blocks: int) -> list[int]:
        return [t for _ in range(blocks) for t in self.block()]

    def of(self, segments: Sequence[str]) -> list[int]:
        return [t for name in segments for t in self._segments.setdefault(name, self.block())]


def _setup(scenario: Scenario) -> Setup:
    device = scenario.pool_blocks * BLOCK
    cap = scenario.namespace_cap_blocks
    cap_tokens = device if cap == NO_CAP else (None if cap is None else int(cap) * BLOCK)
    host = 4 * device if HOST_TIER in scenario.requires else 0
    return Setup(device_tokens=device, namespace_cap_tokens=cap_tokens, host_tokens=host)


def play(host: EvictionHost, scenario: Scenario) -> set[str]:
    """Run ``scenario`` on a fresh session of ``host``; the labels that survive."""
    tokens = _Tokens()
    session = host.open(_setup(scenario))
    try:
        for op in scenario.ops:
            if isinstance(op, Call):
                head = scenario.prompts[op.who]
                prompt = tokens.of(head + op.dynamic) + tokens.fresh(op.suffix)
                hint = None if op.steps is None else KVFlowHint(
                    workflow_id=op.workflow, namespace=op.namespace, agent=op.who, steps=dict(op.steps))
                fixed = len(head) * BLOCK if hint is not None and op.declared else None
                session.request(prompt, hint, fixed)
            elif isinstance(op, Steps):
                session.apply_steps(StepsUpdate(workflow_id=op.workflow, namespace=op.namespace,
                                                steps=dict(op.steps), done=op.done))
            elif isinstance(op, Pressure):
                session.request(tokens.fresh(op.blocks), None, None)
            else:
                session.evict_host(op.blocks * BLOCK)
        any_tier = scenario.tier == "any"
        return {label for label, segments in scenario.prompts.items()
                if session.held(tokens.of(segments), any_tier=any_tier) >= len(segments) * BLOCK}
    finally:
        session.close()
