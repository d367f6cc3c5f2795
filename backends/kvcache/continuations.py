"""Continuations: conversations kept across an agent's pause (a tool call, an announced wait).

A ReAct agent calls the model, runs a tool for a moment or for many seconds, then calls again with
its whole conversation plus the tool's result. Under pressure from other agents LRU evicts that
conversation during the pause and the next turn pays the prefill again. The brain keeps it instead,
until a retention deadline, ranked against the other agents' fixed prompts by when it will be used:

* **When.** A request's reply ends in tool calls (the host says so with :meth:`Continuations.pause`
  and the tools' names), or its hint carries ``resume_in_s`` (the client announced the pause). The
  conversation kept is the request's prompt and reply, as the host inserted it
  (:meth:`Continuations.note_turn`).
* **Tied back by a session.** A hinted request's session is its ``(namespace, workflow_id/agent)``;
  plain traffic needs an explicit session key (the OpenAI ``user`` / ``prompt_cache_key`` fields).
  A request without either is never kept: nothing would tie its return to it.
* **Ranked by expected time to reuse, in steps.** The policy orders protected prefixes by steps
  (how many agent calls away they are). A continuation expected back in ``t`` seconds gets
  ``t / step_s`` steps, where ``step_s`` is the observed mean duration of one model call (decayed,
  :data:`STEP_DECAY`; ``step_default_s`` before any call ended). So a conversation whose tool takes
  as long as three calls ranks with an agent three steps away; as the pause runs, the time left is
  what counts (re-ranked at each deadline sweep once it is a whole step closer). It rides on the hint table as a
  one-agent workflow of its own, so every host's :func:`~.policy.kvflow_key` ranks it with no change,
  the namespace cap counts its tokens (:class:`~.prefixes.AgentPrefixes`), and prefetch sees it.
  A hinted agent's own steps in its workflow are deferred to the same value
  (:meth:`~.hints.HintTable.defer`): its last hint said 0 ("runs now"), but paused it runs again
  only when its conversation does, so its fixed prompt no longer outranks (and, in the namespace
  cap, crowds out) the paused conversations of others; its next hint sets them again.
* **Deadline.** ``t`` is the client's ``resume_in_s``, else the tools' observed pause
  (:class:`ToolDurations`: per tool name and namespace, the :data:`TOOL_QUANTILE` quantile of the
  last :data:`TOOL_WINDOW` observed pauses, the slowest of the reply's tools; ``tool_default_s``
  cold). The conversation is kept until ``t * DEADLINE_SLACK + DEADLINE_GRACE_S`` after the pause
  began, at most ``continuation_max_s``. Past it the record is dropped and its tags go: the
  conversation is as evictable as any dynamic suffix (counted ``continuations_expired``).
* **Return.** The session's next request teaches :class:`ToolDurations` how long the pause lasted
  (a late one too: a slow tool's deadline grows from its cold-start default); before the deadline it
  counts ``continuations_reused``, and the kept record stays until that
  request ends (it then holds its own lock), when :meth:`Continuations.conclude` drops it, and a new
  pause keeps the longer conversation.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Generic, MutableMapping, Sequence, TypeVar

from .bounded import BoundedLRU
from .hints import AgentRef, HintTable
from .prefixes import AgentPrefixes

__all__ = ["SessionRef", "ToolDurations", "Continuation", "Continuations", "CONTINUATION_COUNTERS",
           "TOOL_WINDOW", "TOOL_QUANTILE", "DEADLINE_SLACK", "DEADLINE_GRACE_S", "STEP_DECAY"]

P = TypeVar("P")

SessionRef = tuple[str, str]
"""``(namespace, session key)``: what ties a returning request to its kept conversation."""

CONTINUATION_COUNTERS = ("continuations_kept", "continuations_reused", "continuations_expired")
TOOL_WINDOW = 32
TOOL_QUANTILE = 0.9
DEADLINE_SLACK = 1.5
DEADLINE_GRACE_S = 1.0
STEP_DECAY = 0.2
"""Weight of the newest call in the decayed mean call duration (about the last five calls count)."""
_AGENT_PREFIX = "~continuation/"  # the continuation's agent name in the hint table (no agent of a client)


class ToolDurations:
    """Observed pauses per ``(namespace, tool)``: the last :data:`TOOL_WINDOW` of each, at most
    ``max_tools`` tools (the least recently observed forgotten first)."""

    def __init__(self, default_s: float, max_tools: int = 4096) -> None:
        self.default_s = default_s
        self._seen: BoundedLRU[tuple[str, str], list[float]] = BoundedLRU(max_tools)

    def observe(self, namespace: str, tool: str, seconds: float) -> None:
        key = (namespace, tool)
        window = self._seen.pop(key) or []
        window.append(max(0.0, seconds))
        self._seen.put(key, window[-TOOL_WINDOW:])

    def estimate(self, namespace: str, tools: Sequence[str]) -> float:
        """The expected pause for a reply calling ``tools``: the slowest known tool's quantile;
        ``default_s`` when none of them was observed yet."""
        known = [_quantile(w, TOOL_QUANTILE) for tool in tools if (w := self._seen.get((namespace, tool)))]
        return max(known) if known else self.default_s

    def __len__(self) -> int:
        return len(self._seen)


@dataclass
class Continuation(Generic[P]):
    ref: AgentRef
    """The agent ref its conversation is tagged with (one per session)."""
    record: P
    tokens: int
    tools: tuple[str, ...]
    paused_at: float
    deadline: float
    expected_s: float = 0.0
    """The pause expected when it began; the time left of it, in steps, ranks the conversation."""
    steps: float = 0.0
    returned: bool = False


class Continuations(Generic[P]):
    """Kept conversations of one host; part of :class:`~.intake.RequestIntake`, which calls it."""

    def __init__(self, hints: HintTable, prefixes: AgentPrefixes[P], counters: MutableMapping[str, int], *,
                 tool_default_s: float, max_s: float, step_default_s: float, max_sessions: int,
                 max_tokens: int) -> None:
        """``counters`` is the intake's: :data:`CONTINUATION_COUNTERS` are set there."""
        self.hints, self.prefixes = hints, prefixes
        self.durations = ToolDurations(tool_default_s)
        self.max_s = max_s
        self.step_s = step_default_s
        self.counters = counters
        for name in CONTINUATION_COUNTERS:
            counters.setdefault(name, 0)
        self._kept: dict[SessionRef, Continuation[P]] = {}
        # The last conversation of each session, until a pause keeps it (a host learns of tool calls
        # after the request ended): bounded in sessions and tokens.
        self._turns: BoundedLRU[SessionRef, tuple[P, int]] = BoundedLRU(max_sessions, max_tokens,
                                                                         weigh=lambda turn: turn[1])
        # Expired pauses whose return is still to come: a tool that outlasts its deadline is learned
        # from all the same (else a slow tool's cold-start deadline would never grow).
        self._late: BoundedLRU[SessionRef, tuple[tuple[str, ...], float]] = BoundedLRU(max_sessions)
        self._hinted: BoundedLRU[SessionRef, tuple[str, str]] = BoundedLRU(max_sessions)  # workflow, agent

    def returning(self, session: SessionRef, now: float) -> bool:
        """A request of ``session`` arrived: whether it returns to a kept conversation (counted,
        and the pause's duration observed for its tools)."""
        late = self._late.pop(session)
        if late is not None:  # back after its deadline: too late to reuse, not to learn from
            self._observe(session[0], late[0], now - late[1])
        kept = self._kept.get(session)
        if kept is None or kept.returned or now > kept.deadline:
            return False
        kept.returned = True
        self.counters["continuations_reused"] += 1
        self._observe(session[0], kept.tools, now - kept.paused_at)
        return True

    def _observe(self, namespace: str, tools: Sequence[str], seconds: float) -> None:
        for tool in tools:
            self.durations.observe(namespace, tool, seconds)

    def note_agent(self, session: SessionRef, workflow_id: str, agent: str) -> None:
        """A hinted session: ``agent`` of ``workflow_id``, whose steps a pause defers."""
        self._hinted.put(session, (workflow_id, agent))

    def note_turn(self, session: SessionRef, record: P, tokens: int, call_s: float | None) -> list[tuple[AgentRef, P]]:
        """A request of ``session`` ended with ``record`` (``tokens`` long) in the host's tree after a
        call of ``call_s`` seconds. Drops the continuation it returned to; returns records to untag."""
        if call_s is not None and math.isfinite(call_s) and call_s >= 0:
            self.step_s += STEP_DECAY * (call_s - self.step_s)
        self._turns.put(session, (record, tokens))
        kept = self._kept.get(session)
        return self._drop(session) if kept is not None and kept.returned else []

    def pause(self, session: SessionRef, tools: Sequence[str], resume_in_s: float | None,
              now: float) -> tuple[Continuation[P] | None, list[tuple[AgentRef, P]]]:
        """Keep ``session``'s last conversation across a pause: calling ``tools`` (their observed
        durations give the deadline), or ``resume_in_s`` seconds announced by the client. Returns
        the continuation (``None``: no conversation known for the session) for the host to tag with
        its ``ref``, and records to untag."""
        turn = self._turns.pop(session)
        if turn is None:
            return None, []
        record, tokens = turn
        expected = resume_in_s if resume_in_s is not None else self.durations.estimate(session[0], tools)
        hold = min(self.max_s, expected * DEADLINE_SLACK + DEADLINE_GRACE_S)
        stale = self._drop(session)
        ref = (session[0], _AGENT_PREFIX + _digest(session[1]))
        steps = self._steps(expected)
        kept = Continuation(ref, record, tokens, tuple(tools), now, now + hold, expected, steps)
        self._kept[session] = kept
        self.hints.set_steps(session[0], ref[1], {ref[1]: steps})
        hinted = self._hinted.get(session)
        if hinted is not None:  # the paused agent's own prefix is due when its conversation is
            self.hints.defer(session[0], hinted[0], hinted[1], steps)
        stale += self.prefixes.remember(ref, record, tokens)
        self.counters["continuations_kept"] += 1
        return kept, stale

    def expire(self, now: float) -> list[tuple[AgentRef, P]]:
        """Drop every continuation past its deadline (those never returned to count as expired);
        returns the records to untag. The others are ranked anew by the time left of their pause
        (a whole step closer at least: each change re-keys the hosts' eviction queues)."""
        stale: list[tuple[AgentRef, P]] = []
        for session, kept in list(self._kept.items()):
            if now > kept.deadline:
                if not kept.returned:
                    self.counters["continuations_expired"] += 1
                    self._late.put(session, (kept.tools, kept.paused_at))
                stale += self._drop(session)
            elif not kept.returned:
                steps = self._steps(kept.paused_at + kept.expected_s - now)
                if steps <= kept.steps - 1:
                    kept.steps = steps
                    self.hints.set_steps(session[0], kept.ref[1], {kept.ref[1]: steps})
        return stale

    def _steps(self, seconds: float) -> float:
        """Seconds until reuse as steps: model calls of the observed mean duration."""
        return _rounded(max(0.0, seconds) / max(self.step_s, 1e-3))

    def next_deadline(self) -> float:
        return min((kept.deadline for kept in self._kept.values()), default=math.inf)

    def get(self, session: SessionRef) -> Continuation[P] | None:
        return self._kept.get(session)

    def __len__(self) -> int:
        return len(self._kept)

    def _drop(self, session: SessionRef) -> list[tuple[AgentRef, P]]:
        kept = self._kept.pop(session, None)
        if kept is None:
            return []
        self.hints.forget(session[0], kept.ref[1])
        if self.prefixes.get(kept.ref) is None:
            return []  # the registry forgot it already (and returned it for untagging then)
        return self.prefixes.remember(kept.ref, kept.record, 0)


def _digest(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


def _rounded(steps: float) -> float:
    """Six significant digits, as the step math rounds steps (ties fall to LRU)."""
    return float(f"{steps:.6g}")


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
