"""Request intake: the one place where an arriving request's hint meets the brain, on every host.

Each host (the embedded engine, the simulator, the SGLang plugin, the vLLM plugin) describes an
arriving request as an :class:`AgentRequest` and calls :meth:`RequestIntake.accept` once, before
any of its KV exists. The intake applies the hint to the :class:`~.hints.HintTable`, decides the
request's fixed boundary, counts, and answers with an :class:`IntakeDecision`: which agent the
request is, and how many leading prompt tokens the host tags as that agent's fixed prefix. The host
tags them in its own tree (the brain's radix nodes, SGLang's nodes, vLLM's block hashes) once the KV
is there, then reports the record with :meth:`RequestIntake.remember` (the agent registry,
:class:`~.prefixes.AgentPrefixes`: the namespace cap and prefetch read it). Host-specific parts stay
in the hosts: how a hint is read off a request, how text boundaries become tokens, how tags live on
their tree, and a clock (SGLang's message stamps).

The fixed boundary, one rule for every host: **the longer of the declared boundary (the hint's
``fixed_prefix``, converted to tokens by the host) and the prefix the prompt shares with the
agent's previous request** (:class:`~.segment.Segmenter`); without a declaration, the shared prefix
alone (0 on an agent's first request). The declaration is a floor, not the whole of what recurs:

* what two calls of an agent share beyond its fixed prompt is evidence that the next call reuses it
  too (MetaGPT's Engineer is re-sent the same design and plan every fix round; a chat template
  repeats its role header). Left untagged it is evicted before every tagged node, where LRU would
  have kept it: on vLLM (no host tier) kvflow then hit less than stock LRU on MetaGPT, and tagging
  it moved kvflow from 2,688 to 2,816 hit tokens (stock: 3,072). On the embedded engine's
  ``kvflow demo`` (SmolLM2, 1,536-token device pool) this rule prefetches 1,464 tokens where the
  declared boundary alone prefetched 1,412, and stalls on 189 host-hit tokens instead of 241, with
  the same 4,250 recomputed and the same hits on device;
* the extension follows the agent's last two calls: when they stop sharing, the boundary falls back
  to the declaration (hosts that untag, as the brain does, untag the old tail). It counts against
  the namespace cap like any fixed prefix, so a long shared part can cost an agent its protection,
  never more than the cap;
* without a declaration (plain traffic, issue 23) both readings agree: the shared prefix is all the
  evidence there is.

Where the next features go (one place for every host):

* a learner of agents, sessions and steps from unhinted traffic (issue 23): :meth:`accept` asks
  :meth:`_hint_for` for a request's hint; a learner answers there for requests without one (a
  declared hint always wins), and :class:`AgentRequest` grows what it reads (messages, tools, the
  session key). Learned hints then take the same path: hint table, boundary, registry, counters
  (``unhinted_requests`` already counts what it would see);
* tool-call continuations (issue 24, :mod:`.continuations`): :meth:`accept` ties a request to its
  session (the hint's workflow and agent, else the request's explicit session key) and says in
  :attr:`IntakeDecision.resumes` whether it returns to a kept conversation; the host reports the
  end of every request with a session (:meth:`conclude`, with what it inserted) and a reply that
  ends in tool calls (:meth:`pause`); a hint's ``resume_in_s`` pauses at :meth:`conclude`. Once the
  returning call arrives, what it shares with the paused one is fixed by the rule above until the
  agent's calls stop sharing it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Generic, NamedTuple, Sequence, TypeVar

from kvflow_orch.protocol import DEFAULT_NAMESPACE, KVFlowHint, StepsUpdate

from .config import CacheConfig
from .continuations import Continuation, Continuations, SessionRef
from .hints import AgentRef, HintTable
from .prefixes import AgentPrefixes
from .segment import Segmenter

__all__ = ["AgentRequest", "IntakeDecision", "UNHINTED", "RequestIntake", "INTAKE_COUNTERS"]

P = TypeVar("P")

INTAKE_COUNTERS = ("hinted_requests", "unhinted_requests", "tagged_requests", "steps_updates")
"""Monotonic counters every host reports under these names."""


class AgentRequest(NamedTuple):
    """What a host knows of an arriving request before any of its KV exists."""

    prompt: Sequence[int]
    """The prompt's token ids."""
    hint: KVFlowHint | None = None
    """The hint it carries, validated (``None``: unhinted)."""
    fixed_prefix_tokens: int | None = None
    """The declared fixed boundary in tokens (the hint's ``fixed_prefix`` converted by the host)."""
    session: str | None = None
    """An explicit session key (OpenAI's ``user`` / ``prompt_cache_key``): ties an unhinted request's
    return from a tool call to its kept conversation."""


class IntakeDecision(NamedTuple):
    """What the host does with a request: tag its first ``fixed_tokens`` prompt tokens as
    ``agent``'s fixed prefix once they are in its tree (``agent is None``: nothing to tag).
    ``session``: the conversation it belongs to (``None``: none, never kept across a pause);
    ``resumes``: it returns to a kept conversation (hosts admit it ahead of new sessions);
    ``resume_in_s``: its hint announced a pause after it; ``accepted_at``: the intake's clock then."""

    agent: AgentRef | None
    fixed_tokens: int = 0
    session: SessionRef | None = None
    resumes: bool = False
    resume_in_s: float | None = None
    accepted_at: float | None = None


UNHINTED = IntakeDecision(None, 0)


class RequestIntake(Generic[P]):
    """Hint table, segmentation history, agent registry and counters of one host. Not
    thread-safe: the host's scheduling loop is its only caller. ``P`` is the host's record of a
    tagged prefix (see :class:`~.prefixes.AgentPrefixes`)."""

    def __init__(self, config: CacheConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` drives hint TTLs and continuation deadlines. The namespace cap is the config's;
        a host that learns its pool size later changes it with ``hints.set_cap``."""
        self.config = config
        self.clock = clock
        self.hints = HintTable(ttl_s=config.hint_ttl_s, clock=clock, cap_tokens=config.effective_namespace_cap,
                               max_workflows=config.max_workflows, max_agents=config.max_tracked_agents)
        self.segmenter = Segmenter(config.segment_history, config.max_tracked_agents, config.tracked_tokens)
        self.prefixes: AgentPrefixes[P] = AgentPrefixes(self.hints, config.max_tracked_agents, config.tracked_tokens)
        self.counters: Counter[str] = Counter({name: 0 for name in INTAKE_COUNTERS})
        self.continuations: Continuations[P] = Continuations(
            self.hints, self.prefixes, self.counters, tool_default_s=config.tool_default_s,
            max_s=min(config.continuation_max_s, config.hint_ttl_s), step_default_s=config.step_default_s,
            max_sessions=config.max_tracked_agents, max_tokens=config.tracked_tokens,
            tool_cold_hold_s=config.tool_cold_hold_s)

    def size_for(self, config: CacheConfig) -> None:
        """The host learned its device pool (``config``, the same settings sized): the namespace
        cap and the token bounds follow it."""
        self.config = config
        self.hints.set_cap(config.effective_namespace_cap)
        self.segmenter.max_tokens = self.prefixes.max_tokens = config.tracked_tokens

    # ---- requests ------------------------------------------------------------------------
    def accept(self, request: AgentRequest) -> IntakeDecision:
        """Apply the request's hint and decide its fixed boundary (the module docstring's rule).
        Raises ValueError (changing nothing) on a negative declared boundary."""
        declared = request.fixed_prefix_tokens
        if declared is not None and declared < 0:
            raise ValueError(f"fixed_prefix_tokens must be >= 0, got {declared}")
        hint = self._hint_for(request)
        session = self.session_of(hint, request.session)
        now = self.clock()
        resumes = session is not None and self.continuations.returning(session, now)
        if hint is None:
            self.counters["unhinted_requests"] += 1
            return UNHINTED if session is None else IntakeDecision(None, 0, session, resumes, None, now)
        self.hints.apply_hint(hint)
        self.counters["hinted_requests"] += 1
        if session is not None and self.config.continuations:
            self.continuations.note_agent(session, hint.workflow_id, hint.agent)
        ref: AgentRef = (hint.namespace, hint.agent)
        return IntakeDecision(ref, self.fixed_boundary(ref, request.prompt, declared), session, resumes,
                              hint.resume_in_s, now)

    def fixed_boundary(self, ref: AgentRef, prompt: Sequence[int], declared: int | None) -> int:
        """The rule: the longer of ``declared`` (clamped to the prompt) and the prefix ``prompt``
        shares with ``ref``'s previous request. Records ``prompt`` in ``ref``'s history."""
        shared = self.segmenter.observe(ref, prompt)
        return shared if declared is None else max(min(declared, len(prompt)), shared)

    def apply_hint(self, hint: KVFlowHint) -> None:
        """A hint without a request to decide a boundary for (replays, tests)."""
        self.hints.apply_hint(hint)

    def apply_steps(self, update: StepsUpdate) -> None:
        """``POST /kvflow/v1/steps``; ``done`` forgets the workflow."""
        self.hints.apply_steps(update)
        self.counters["steps_updates"] += 1

    # ---- continuations (.continuations) --------------------------------------------------
    @staticmethod
    def session_of(hint: KVFlowHint | None, key: str | None) -> SessionRef | None:
        """The session a request belongs to: a hinted one's agent in its workflow, else its
        explicit session ``key`` (``None``: none)."""
        if hint is not None:
            return hint.namespace, f"{hint.workflow_id}/{hint.agent}"
        return None if key is None else (DEFAULT_NAMESPACE, key)

    def conclude(self, decision: IntakeDecision, record: P, tokens: int
                 ) -> tuple[Continuation[P] | None, list[tuple[AgentRef, P]]]:
        """A request of a session ended with ``record`` (``tokens`` long) in the host's tree. Drops
        the conversation it returned to; with a hint's ``resume_in_s``, keeps the new one at once.
        Returns the continuation to tag (``None``: none) and the records to untag."""
        if decision.session is None or not self.config.continuations:
            return None, []
        now = self.clock()
        call_s = None if decision.accepted_at is None else now - decision.accepted_at
        fixed = None if decision.agent is None else (decision.agent, min(decision.fixed_tokens, tokens))
        stale = self.continuations.note_turn(decision.session, record, tokens, call_s, fixed)
        if decision.resume_in_s is None:
            return None, stale
        kept, more = self.continuations.pause(decision.session, (), decision.resume_in_s, now)
        return kept, stale + more

    def pause(self, session: SessionRef, tools: Sequence[str], resume_in_s: float | None = None
              ) -> tuple[Continuation[P] | None, list[tuple[AgentRef, P]]]:
        """The session's last reply ended in calls of ``tools``: keep its conversation (see
        :meth:`Continuations.pause <.continuations.Continuations.pause>`)."""
        if not self.config.continuations:
            return None, []
        return self.continuations.pause(session, tools, resume_in_s, self.clock())

    def expire_continuations(self) -> list[tuple[AgentRef, P]]:
        """Drop the continuations past their deadline; returns the records the host untags."""
        if not len(self.continuations):
            return []
        return self.continuations.expire(self.clock())

    # ---- the agent registry --------------------------------------------------------------
    def remember(self, ref: AgentRef, prefix: P, tokens: int) -> list[tuple[AgentRef, P]]:
        """The host tagged ``tokens`` leading tokens as ``ref``'s fixed prefix, recorded as
        ``prefix``. Counts a tagged request; returns the records the host may untag (see
        :meth:`AgentPrefixes.remember <.prefixes.AgentPrefixes.remember>`)."""
        if tokens > 0:
            self.counters["tagged_requests"] += 1
        return self.prefixes.remember(ref, prefix, tokens)

    def due(self, lookahead: float) -> list[tuple[float, AgentRef, P]]:
        """Agents with a recorded prefix whose effective steps are <= ``lookahead``, most urgent
        first, with their records: the prefetch candidates (hint TTLs applied first)."""
        self.hints.expire()
        out = []
        for steps, ref in self.hints.due(lookahead):
            prefix = self.prefixes.get(ref)
            if prefix is not None:
                out.append((steps, ref, prefix))
        return out

    # ---- reporting -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counts only (no prompts, agents or workflow ids): ``counters`` (:data:`INTAKE_COUNTERS` and
        :data:`~.continuations.CONTINUATION_COUNTERS`), ``continuations`` kept now,
        ``workflows`` live, ``agents_with_prefix`` in the registry."""
        return {"counters": dict(self.counters), "workflows": self.hints.workflow_count,
                "agents_with_prefix": len(self.prefixes), "continuations": len(self.continuations)}

    # ---- internal helpers ----------------------------------------------------------------
    def _hint_for(self, request: AgentRequest) -> KVFlowHint | None:
        """The hint the request is handled under: its own (issue 23's learner answers here for
        requests without one)."""
        return request.hint

