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
  :data:`STEP_DECAY`; ``step_default_s`` before any call ended). ``t`` is the *expected* pause: the
  mean of the tool's observed pauses (not the quantile the deadline uses: a tool that is usually
  quick and sometimes slow is usually back soon). So a conversation whose tool takes as long as
  three calls ranks with an agent three steps away. As the pause runs, the time left is what counts
  (:meth:`Continuation.remaining_s`, re-ranked at each deadline sweep once it moved a whole step,
  with what was learned of its tools meanwhile: a cold pause learns from another's return):
  the mean residual life of the observed pauses after this long, their CDF interpolated between
  neighbours (:func:`mean_residual_s`: continuous as the pause runs past an observation, where the
  mean of what is left of those that lasted longer jumps and would rank an older pause farther
  than a younger one; issue 24, slow tools); a pause that has outlasted
  them all (or a cold estimate) is expected to last as long again as it has run, so an overdue
  conversation sinks below those due soon instead of ranking as due now (an announced one is due
  now once its time came: the client said so). It rides on the
  hint table as a one-agent workflow of its own, so every host's :func:`~.policy.kvflow_key` ranks
  it with no change, the namespace cap counts its tokens (:class:`~.prefixes.AgentPrefixes`; those
  it shares with its agent's fixed prefix, its first ones, count once), and prefetch sees it.
  Once its return arrives it ranks as running (0 steps) until that call ends.
  A hinted agent's own steps in its workflow are deferred to the same value
  (:meth:`~.hints.HintTable.defer`): its last hint said 0 ("runs now"), but paused it runs again
  only when its conversation does, so its fixed prompt no longer outranks (and, in the namespace
  cap, crowds out) the paused conversations of others; its next hint sets them again.
* **Deadline.** From the client's ``resume_in_s`` ``r``: ``r * DEADLINE_SLACK + DEADLINE_GRACE_S``
  after the pause began; else from the tools' observed pauses (:class:`ToolDurations`: per tool name
  and namespace, the last :data:`TOOL_WINDOW` of each): ``q * DEADLINE_SLACK + DEADLINE_GRACE_S``
  with ``q`` the :data:`TOOL_QUANTILE` quantile of the slowest of the reply's tools. A reply none of
  whose tools was observed yet is kept ``tool_cold_hold_s`` (30 s by default: a slow tool's first
  run is not cut off by the 2 s expected of a quick one, ``tool_default_s``, which only ranks it;
  the cost of holding it is bounded by the rank, which sinks as the pause outlasts its estimate).
  Always at most ``continuation_max_s``. Past it the record is dropped and its tags go: the
  conversation is as evictable as any dynamic suffix (counted ``continuations_expired``).
* **Return.** The session's next request teaches :class:`ToolDurations` how long the pause lasted
  (a late one too: a slow tool's deadline grows from its cold-start default); before the deadline it
  counts ``continuations_reused``, and the kept record stays until that
  request ends (it then holds its own lock), when :meth:`Continuations.conclude` drops it, and a new
  pause keeps the longer conversation.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass
from typing import Generic, MutableMapping, NamedTuple, Sequence, TypeVar

from .bounded import BoundedLRU
from .hints import AgentRef, HintTable
from .prefixes import AgentPrefixes

__all__ = ["SessionRef", "ToolDurations", "PauseEstimate", "hold_for", "mean_residual_s", "Continuation",
           "Continuations", "CONTINUATION_COUNTERS", "TOOL_WINDOW", "TOOL_QUANTILE", "DEADLINE_SLACK",
           "DEADLINE_GRACE_S", "STEP_DECAY"]

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


class PauseEstimate(NamedTuple):
    """What the observed pauses say of a new one."""

    expected_s: float
    """The mean pause (of the reply's slowest tool by mean): what ranks the conversation."""
    hold_s: float
    """How long to keep the conversation (before ``continuation_max_s``)."""
    samples: tuple[float, ...] = ()
    """That tool's observed pauses, ascending (``()``: none observed)."""


def hold_for(seconds: float) -> float:
    """The retention of a pause expected to last ``seconds`` at most (a quantile, an announcement)."""
    return seconds * DEADLINE_SLACK + DEADLINE_GRACE_S


class ToolDurations:
    """Observed pauses per ``(namespace, tool)``: the last :data:`TOOL_WINDOW` of each, at most
    ``max_tools`` tools (the least recently observed forgotten first). Cold (no tool of a reply
    observed yet): ``default_s`` expected, kept ``cold_hold_s``."""

    def __init__(self, default_s: float, max_tools: int = 4096, cold_hold_s: float | None = None) -> None:
        self.default_s = default_s
        self.cold_hold_s = hold_for(default_s) if cold_hold_s is None else cold_hold_s
        # (namespace, tool) -> (window in observation order, the same ascending)
        self._seen: BoundedLRU[tuple[str, str], tuple[list[float], tuple[float, ...]]] = BoundedLRU(max_tools)
        self.version = 0
        """Grows at every observation (what was estimated before may be estimated anew)."""

    def observe(self, namespace: str, tool: str, seconds: float) -> None:
        key = (namespace, tool)
        old = self._seen.pop(key)
        window = (old[0] if old is not None else []) + [max(0.0, seconds)]
        window = window[-TOOL_WINDOW:]
        self._seen.put(key, (window, tuple(sorted(window))))
        self.version += 1

    def estimate(self, namespace: str, tools: Sequence[str]) -> PauseEstimate:
        """The pause of a reply calling ``tools``: expected, the mean of the slowest known tool by
        mean; held for the largest :data:`TOOL_QUANTILE` quantile of them (:func:`hold_for`). Cold
        when none of them was observed yet."""
        known = [seen[1] for tool in tools if (seen := self._seen.get((namespace, tool)))]
        if not known:
            return PauseEstimate(self.default_s, self.cold_hold_s)
        slowest = max(known, key=lambda w: sum(w) / len(w))
        quantile = max(w[min(len(w) - 1, int(TOOL_QUANTILE * len(w)))] for w in known)
        return PauseEstimate(sum(slowest) / len(slowest), hold_for(quantile), slowest)

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
    samples: tuple[float, ...] = ()
    """The observed pauses of its slowest tool, ascending (:meth:`remaining_s`)."""
    announced: bool = False
    """The client gave the pause (``resume_in_s``)."""
    estimated: int = 0
    """The :attr:`ToolDurations.version` its estimate is of."""

    def remaining_s(self, elapsed: float) -> float:
        """Seconds still expected after ``elapsed`` of the pause: below the longest observed pause,
        the mean residual life of the observed pauses (:func:`mean_residual_s`); without one (cold,
        or outlasting them all), the estimate's rest while it lasts, then as long again as it has
        run. An announced pause is due when the client said, and then due now (within its
        deadline's slack)."""
        if self.samples and elapsed < self.samples[-1]:
            return mean_residual_s(self.samples, elapsed)
        if elapsed < self.expected_s or self.announced:
            return max(0.0, self.expected_s - elapsed)
        return elapsed


class Continuations(Generic[P]):
    """Kept conversations of one host; part of :class:`~.intake.RequestIntake`, which calls it."""

    def __init__(self, hints: HintTable, prefixes: AgentPrefixes[P], counters: MutableMapping[str, int], *,
                 tool_default_s: float, max_s: float, step_default_s: float, max_sessions: int,
                 max_tokens: int, tool_cold_hold_s: float | None = None) -> None:
        """``counters`` is the intake's: :data:`CONTINUATION_COUNTERS` are set there."""
        self.hints, self.prefixes = hints, prefixes
        self.durations = ToolDurations(tool_default_s, cold_hold_s=tool_cold_hold_s)
        self.max_s = max_s
        self.step_s = step_default_s
        self.counters = counters
        for name in CONTINUATION_COUNTERS:
            counters.setdefault(name, 0)
        self._kept: dict[SessionRef, Continuation[P]] = {}
        # The last conversation of each session, until a pause keeps it (a host learns of tool calls
        # after the request ended): bounded in sessions and tokens.
        # With it, the agent whose fixed prefix its first tokens are, and how many (the cap counts them once).
        self._turns: BoundedLRU[SessionRef, tuple[P, int, tuple[AgentRef, int] | None]] = BoundedLRU(
            max_sessions, max_tokens, weigh=lambda turn: turn[1])
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
        kept.steps = 0.0  # it runs now: its conversation ranks as a running agent's until the call ends
        self.hints.set_steps(session[0], kept.ref[1], {kept.ref[1]: 0.0})
        self.counters["continuations_reused"] += 1
        self._observe(session[0], kept.tools, now - kept.paused_at)
        return True

    def _observe(self, namespace: str, tools: Sequence[str], seconds: float) -> None:
        for tool in tools:
            self.durations.observe(namespace, tool, seconds)

    def note_agent(self, session: SessionRef, workflow_id: str, agent: str) -> None:
        """A hinted session: ``agent`` of ``workflow_id``, whose steps a pause defers."""
        self._hinted.put(session, (workflow_id, agent))

    def note_turn(self, session: SessionRef, record: P, tokens: int, call_s: float | None,
                  fixed: tuple[AgentRef, int] | None = None) -> list[tuple[AgentRef, P]]:
        """A request of ``session`` ended with ``record`` (``tokens`` long) in the host's tree after a
        call of ``call_s`` seconds; its first ``fixed[1]`` tokens were tagged as agent ``fixed[0]``'s
        fixed prefix. Drops the continuation it returned to; returns records to untag."""
        if call_s is not None and math.isfinite(call_s) and call_s >= 0:
            self.step_s += STEP_DECAY * (call_s - self.step_s)
        self._turns.put(session, (record, tokens, fixed if fixed is not None and fixed[1] > 0 else None))
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
        record, tokens, fixed = turn
        if resume_in_s is not None:
            estimate = PauseEstimate(resume_in_s, hold_for(resume_in_s))
        else:
            estimate = self.durations.estimate(session[0], tools)
        expected = estimate.expected_s
        hold = min(self.max_s, estimate.hold_s)
        stale = self._drop(session)
        ref = (session[0], _AGENT_PREFIX + _digest(session[1]))
        steps = self._steps(expected)
        kept = Continuation(ref, record, tokens, tuple(tools), now, now + hold, expected, steps,
                            samples=estimate.samples, announced=resume_in_s is not None,
                            estimated=self.durations.version)
        self._kept[session] = kept
        self.hints.set_steps(session[0], ref[1], {ref[1]: steps})
        hinted = self._hinted.get(session)
        if hinted is not None:  # the paused agent's own prefix is due when its conversation is
            self.hints.defer(session[0], hinted[0], hinted[1], steps)
        stale += self.prefixes.remember(ref, record, tokens, fixed)
        self.counters["continuations_kept"] += 1
        return kept, stale

    def expire(self, now: float) -> list[tuple[AgentRef, P]]:
        """Drop every continuation past its deadline (those never returned to count as expired);
        returns the records to untag. What was learned of their tools since they paused applies to
        them too (their estimate anew, a deadline only later); they are ranked anew by the time left
        of their pause (a whole step away from their rank at least: each change re-keys the hosts'
        eviction queues)."""
        stale: list[tuple[AgentRef, P]] = []
        for session, kept in list(self._kept.items()):
            if not kept.announced and not kept.returned and kept.estimated != self.durations.version:
                estimate = self.durations.estimate(session[0], kept.tools)
                kept.expected_s, kept.samples = estimate.expected_s, estimate.samples
                kept.deadline = max(kept.deadline, kept.paused_at + min(self.max_s, estimate.hold_s))
                kept.estimated = self.durations.version
            if now > kept.deadline:
                if not kept.returned:
                    self.counters["continuations_expired"] += 1
                    self._late.put(session, (kept.tools, kept.paused_at))
                stale += self._drop(session)
            elif not kept.returned:
                steps = self._steps(kept.remaining_s(now - kept.paused_at))
                if abs(steps - kept.steps) >= 1:
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


def mean_residual_s(samples: Sequence[float], elapsed: float) -> float:
    """The mean residual life after ``elapsed`` (below the largest sample) of the distribution
    whose CDF interpolates the ascending ``samples`` linearly: each gap between two neighbours
    holds an equal share of the mass, spread evenly (one sample: all of it there). Unlike the
    samples' own step CDF (the mean of those above ``elapsed``, minus it), it is continuous in
    ``elapsed``: passing a sample does not make a pause suddenly farther than a younger one."""
    n = len(samples)
    if n == 1:
        return max(0.0, samples[0] - elapsed)
    if elapsed <= samples[0]:
        return sum(samples[j] + samples[j + 1] for j in range(n - 1)) / (2 * (n - 1)) - elapsed
    k = bisect.bisect_right(samples, elapsed)  # elapsed lies in the gap [samples[k-1], samples[k])
    lo, hi = samples[k - 1], samples[k]
    mass = (hi - elapsed) / (hi - lo)  # in units of one gap's share: the part of its gap left
    total = mass * (hi - elapsed) / 2 + sum((samples[j] + samples[j + 1]) / 2 - elapsed for j in range(k, n - 1))
    return total / (mass + n - 1 - k)


def _digest(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


def _rounded(steps: float) -> float:
    """Six significant digits, as the step math rounds steps (ties fall to LRU)."""
    return float(f"{steps:.6g}")
