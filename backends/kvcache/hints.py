"""Hint table: per-workflow steps-to-execution, combined by min, with TTL and a per-namespace cap.

Usable on its own (the SGLang plugin uses it without the radix tree). Agents are identified by an
:data:`AgentRef` ``(namespace, agent)``; workflows by ``(namespace, workflow_id)``.

Rules:

* A hint or a steps update *replaces* the step map of its workflow (the orchestrator re-sends the
  steps of every agent each time). A hint's calling agent gets 0 when its map omits it: it runs now.
* An agent's steps = min over every live workflow of its namespace that names it; ``inf`` when none.
* Every hint or steps update of a workflow marks it as *advanced* (a sequence number,
  :meth:`HintTable.advanced`): the eviction order's tie-break across workflows (:func:`.policy.kvflow_key`).
* A workflow is forgotten on ``done`` or when it has not been updated for ``ttl_s`` seconds;
  :meth:`HintTable.expire` applies the TTL (cheap; callers run it before decisions).
* Memory: at most ``max_workflows`` workflows and ``max_entries`` (workflow, agent) step entries in
  all; beyond either bound the least recently updated workflow is forgotten (one client sending
  thousands of workflows with 4,096-agent maps cannot grow the table without limit).
* Namespace cap: the agents of a namespace with finite steps are protected in ascending steps order
  while the sum of their fixed-prefix tokens stays within ``cap_tokens``; the rest (least urgent)
  get ``inf`` from :meth:`HintTable.steps`. Tokens of a prefix shared by two agents count twice
  (conservative: a namespace never protects more than its cap), except where the sharing is known:
  a continuation (:mod:`.continuations`) holds its agent's fixed prefix as its first tokens, and
  declares so (``within`` of :meth:`HintTable.note_fixed_tokens`); once one of the two counts, the
  other counts only its tokens beyond the shared ones (a paused agent's system prompt counts once).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterator, Mapping

from kvflow_orch.protocol import HintError, KVFlowHint, StepsUpdate, check_steps

from .bounded import Bound, BoundedLRU

__all__ = ["AgentRef", "HintTable", "HintError", "INF"]

AgentRef = tuple[str, str]
"""``(namespace, agent)``: the key of every per-agent table."""

INF = math.inf


class HintTable:
    """Live steps-to-execution per agent. Not thread-safe: one owner applies updates."""

    max_workflows = Bound("_workflows", "max_entries")
    max_entries = Bound("_workflows", "max_weight")  # (workflow, agent) step entries in all
    max_agents = Bound("_fixed_tokens", "max_entries")  # agents with a known fixed-prefix length

    def __init__(
        self,
        *,
        ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        cap_tokens: int | None = None,
        max_workflows: int = 16384,
        max_agents: int = 65536,
        max_entries: int = 32768,
    ) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.cap_tokens = cap_tokens
        self.version = 0
        # (ns, wf) -> (last update time, {agent: steps}, advance number), oldest update first;
        # weighed by the step-map size, so the bound on entries holds over all workflows together.
        self._workflows: BoundedLRU[tuple[str, str], tuple[float, dict[str, float], int]] = BoundedLRU(
            max_workflows, max_entries, weigh=lambda entry: len(entry[1]))
        self._advances = 0  # hints and steps updates applied so far: each workflow's latest is its entry's
        # (ns, agent) -> {wf: steps}: the index that makes the min over workflows cheap.
        self._by_agent: dict[AgentRef, dict[str, float]] = {}
        self._ns_agents: dict[str, set[str]] = {}  # namespace -> agents named by a live workflow
        self._fixed_tokens: BoundedLRU[AgentRef, int] = BoundedLRU(max_agents)  # only lengths > 0
        self._costly: dict[str, set[str]] = {}  # namespace -> agents with a known fixed prefix
        # namespace -> {agent: (other agent, n)}: the agent's first n fixed tokens are the other's
        self._within: dict[str, dict[str, tuple[str, int]]] = {}
        # namespace -> agents the cap unprotects (cache, dropped on any change in the namespace).
        # Only agents with a fixed prefix cost cap space, so this is computed over _costly alone:
        # an update costs O(agents with a cached prefix), not O(agents named by hints). With each, the
        # tokens the protected agents hold (shared tokens once).
        self._unprotected: dict[str, tuple[frozenset[str], int]] = {}

    # ---- updates -------------------------------------------------------------------------
    def apply_hint(self, hint: KVFlowHint) -> None:
        steps = dict(hint.steps)
        steps.setdefault(hint.agent, 0)
        self.set_steps(hint.namespace, hint.workflow_id, steps)

    def apply_steps(self, update: StepsUpdate) -> None:
        if update.done:
            self.forget(update.namespace, update.workflow_id)
        else:
            self.set_steps(update.namespace, update.workflow_id, update.steps)

    def set_steps(self, namespace: str, workflow_id: str, steps: Mapping[str, object]) -> None:
        """Replace the step map of one workflow. Raises :class:`HintError` (nothing changes) on
        negative, NaN or non-numeric steps, empty names, or more than ``MAX_AGENTS`` agents."""
        clean = check_steps(steps)
        self.expire()
        key = (namespace, workflow_id)
        self._drop_workflow(key)
        self._advances += 1
        forgotten = self._workflows.put(key, (self.clock(), clean, self._advances))
        for agent, value in clean.items():
            self._by_agent.setdefault((namespace, agent), {})[workflow_id] = value
            self._ns_agents.setdefault(namespace, set()).add(agent)
        self._unprotected.pop(namespace, None)
        self.version += 1
        for old_key, old_entry in forgotten:
            self._unindex(old_key, old_entry[1])

    def defer(self, namespace: str, workflow_id: str, agent: str, steps: float) -> bool:
        """Raise ``agent``'s steps in one live workflow to ``steps`` (never lower them; the
        workflow's age stays): a paused agent does not run again before its continuation is due
        (:mod:`.continuations`). The workflow's next hint or update replaces it. Returns whether
        anything changed."""
        entry = self._workflows.get((namespace, workflow_id))
        if entry is None or entry[1].get(agent, INF) >= steps:
            return False
        entry[1][agent] = steps
        self._by_agent[(namespace, agent)][workflow_id] = steps
        self._unprotected.pop(namespace, None)
        self.version += 1  # the agent became more evictable: keys may drop
        return True

    def forget(self, namespace: str, workflow_id: str) -> bool:
        """Forget a workflow (``done``); returns whether it was known. Unknown ids are a no-op."""
        return self._drop_workflow((namespace, workflow_id))

    def expire(self) -> int:
        """Forget workflows not updated for ``ttl_s``; returns how many were forgotten."""
        if not self._workflows:
            return 0
        deadline = self.clock() - self.ttl_s
        n = 0
        while (oldest := self._workflows.oldest()) is not None and oldest[1][0] <= deadline:
            self._drop_workflow(oldest[0])
            n += 1
        return n

    def set_cap(self, cap_tokens: int | None) -> None:
        """Change the per-namespace cap (``None``: no cap), e.g. once the device pool size is known."""
        if cap_tokens is not None and cap_tokens < 0:
            raise ValueError(f"namespace cap must be >= 0 tokens, got {cap_tokens}")
        self.cap_tokens = cap_tokens
        self._unprotected.clear()
        self.version += 1  # keys may drop: agents can lose protection

    def note_fixed_tokens(self, ref: AgentRef, tokens: int, within: tuple[AgentRef, int] | None = None) -> None:
        """Record the length of an agent's fixed prefix (used by the namespace cap). ``within``:
        ``(other, n)``, the first ``n`` of these tokens are agent ``other``'s fixed prefix (same
        namespace), counted once in the cap."""
        if tokens < 0:
            raise ValueError(f"fixed-prefix length must be >= 0, got {tokens}")
        if within is not None and (within[0][0] != ref[0] or within[1] < 0):
            raise ValueError(f"within must name an agent of namespace {ref[0]!r} and n >= 0, got {within}")
        old = self._fixed_tokens.pop(ref)
        forgotten: list[tuple[AgentRef, int]] = []
        shares = self._within.get(ref[0], {})
        old_within = shares.pop(ref[1], None)
        if tokens:
            forgotten = self._fixed_tokens.put(ref, tokens)
            self._costly.setdefault(ref[0], set()).add(ref[1])
            if within is not None and within[1]:
                self._within.setdefault(ref[0], {})[ref[1]] = (within[0][1], min(within[1], tokens))
        else:
            self._forget_cost(ref)
        if (old or 0) != tokens or old_within != self._within.get(ref[0], {}).get(ref[1]):
            self._unprotected.pop(ref[0], None)
            self.version += 1
        for gone, _ in forgotten:
            self._forget_cost(gone)
            self._unprotected.pop(gone[0], None)

    def _forget_cost(self, ref: AgentRef) -> None:
        shares = self._within.get(ref[0])
        if shares is not None:
            shares.pop(ref[1], None)
            if not shares:
                del self._within[ref[0]]
        names = self._costly.get(ref[0])
        if names is not None:
            names.discard(ref[1])
            if not names:
                del self._costly[ref[0]]

    def _drop_workflow(self, key: tuple[str, str]) -> bool:
        entry = self._workflows.pop(key)
        if entry is None:
            return False
        self._unindex(key, entry[1])
        return True

    def _unindex(self, key: tuple[str, str], steps: dict[str, float]) -> None:
        """Remove a forgotten workflow's steps from the per-agent index."""
        namespace, wf = key
        for agent in steps:
            per = self._by_agent.get((namespace, agent))
            if per is not None:
                per.pop(wf, None)
                if not per:
                    del self._by_agent[(namespace, agent)]
                    names = self._ns_agents[namespace]
                    names.discard(agent)
                    if not names:
                        del self._ns_agents[namespace]
        self._unprotected.pop(namespace, None)
        self.version += 1

    # ---- queries -------------------------------------------------------------------------
    def raw_steps(self, ref: AgentRef) -> float:
        """Min over live workflows, ignoring the namespace cap; ``inf`` when no workflow names it."""
        per = self._by_agent.get(ref)
        return min(per.values()) if per else INF

    def advanced(self, ref: AgentRef) -> int:
        """When the workflow that gives ``ref`` its :meth:`raw_steps` last advanced: the sequence
        number of its latest hint or steps update (larger is later; of several workflows at that
        min, the earliest); 0 when no workflow names ``ref``.

        Steps count a workflow's own steps from the one it runs now, and concurrent workflows run
        their steps side by side: of two agents at equal steps, the one whose workflow began its
        current step earlier runs first. So among equal steps the brain evicts the agent of the
        workflow that advanced last (:func:`.policy.kvflow_key`), except at 0 steps, where every
        such agent runs now or has just run and the tie goes to LRU."""
        per = self._by_agent.get(ref)
        if not per:
            return 0
        low = min(per.values())
        return min(self._workflows.get((ref[0], wf))[2] for wf, value in per.items() if value == low)

    def steps(self, ref: AgentRef) -> float:
        """Effective steps: :meth:`raw_steps`, or ``inf`` when the namespace cap removed protection."""
        raw = self.raw_steps(ref)
        if raw == INF or self.cap_tokens is None or ref[1] not in self._costly.get(ref[0], ()):
            return raw
        return INF if ref[1] in self._unprotected_in(ref[0]) else raw

    def fixed_tokens(self, ref: AgentRef) -> int:
        return self._fixed_tokens.get(ref, 0)

    def protected_tokens(self, namespace: str) -> int:
        """Fixed-prefix tokens the namespace currently protects (finite effective steps; tokens
        declared shared counted once)."""
        if self.cap_tokens is None:
            return self._cap_walk(namespace, INF)[1]
        return self._unprotected_in_walk(namespace)[1]

    def agents(self) -> Iterator[tuple[AgentRef, float]]:
        """Every agent with finite effective steps, as ``(ref, steps)`` (O(agents named))."""
        for ref in list(self._by_agent):
            value = self.steps(ref)
            if value != INF:
                yield ref, value

    def due(self, lookahead: float) -> list[tuple[float, AgentRef]]:
        """Agents with a known fixed prefix whose effective steps are <= ``lookahead``, most urgent
        first (the prefetch candidates); O(agents with a fixed prefix)."""
        out = []
        for namespace, names in self._costly.items():
            for agent in names:
                value = self.steps((namespace, agent))
                if value <= lookahead:
                    out.append((value, (namespace, agent)))
        out.sort()
        return out

    @property
    def workflow_count(self) -> int:
        return len(self._workflows)

    @property
    def entry_count(self) -> int:
        """(workflow, agent) step entries held, bounded by ``max_entries``."""
        return self._workflows.weight

    def _unprotected_in(self, namespace: str) -> frozenset[str]:
        return self._unprotected_in_walk(namespace)[0]

    def _unprotected_in_walk(self, namespace: str) -> tuple[frozenset[str], int]:
        cached = self._unprotected.get(namespace)
        if cached is None:
            cached = self._unprotected[namespace] = self._cap_walk(namespace, self.cap_tokens)
        return cached

    def _cap_walk(self, namespace: str, cap: float) -> tuple[frozenset[str], int]:
        """The agents ``cap`` unprotects, and the tokens the others hold: agents with finite steps
        in ascending order, each costing its fixed tokens less those it shares with one counted
        before it, while the sum stays within ``cap``."""
        finite = sorted(
            (value, agent) for agent in self._costly.get(namespace, ())
            if (value := self.raw_steps((namespace, agent))) != INF
        )
        shared: dict[str, list[tuple[str, int]]] = {}
        for agent, (other, n) in self._within.get(namespace, {}).items():
            shared.setdefault(agent, []).append((other, n))
            shared.setdefault(other, []).append((agent, n))
        used = 0
        counted: set[str] = set()
        for i, (_, agent) in enumerate(finite):
            overlap = max((min(n, self.fixed_tokens((namespace, other))) for other, n in shared.get(agent, ())
                           if other in counted), default=0)
            cost = max(0, self.fixed_tokens((namespace, agent)) - overlap)
            if used + cost > cap:
                # this agent and every less urgent one fall back below every protected prefix
                return frozenset(a for _, a in finite[i:]), used
            used += cost
            counted.add(agent)
        return frozenset(), used
