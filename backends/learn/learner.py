"""The traffic learner: plain OpenAI requests in, the hints an orchestrator would have sent out.

A host calls it once per request on its chat and completions routes, before the request reaches
its engine, and hands the answer's hint to the brain's intake exactly as it hands a declared one
(the brain keeps seeing only hints):

    learned = learner.observe(body, route="chat", headers=headers, declared=hint)
    request.hint = learned.hint           # the declared hint when there is one, else the learned
    ...
    learner.reply(learned, message)       # the reply as the client sees it: links the next request

``observe`` identifies the agent (:mod:`.agents`), the session (:mod:`.sessions`), records the
transition from the session's previous agent (:mod:`.transitions`) and answers with a hint in the
learner's namespace, workflow ``learned-N`` (one per session), the agents' expected steps from the
session's state (learned routing's semantics, :mod:`.steps`).

**A learned workflow's agents are the session's own** (:func:`session_agent`: ``writer@learned-3``).
In plain traffic most reuse is a session's own conversation: each call of an agent extends its
previous call in that session (a ReAct loop, a supervisor's growing history). Named per session,
an agent's calls in one session are one agent to the brain, so the intake's boundary rule (the
longer of the declared boundary and what the agent's previous request shares) tags that whole
conversation, ranked by the session's expected steps of that agent; named per app, the previous
request was another session's, the shared part was the system prompt alone, and the conversation
stayed untagged, evicted before every tagged prefix (on langgraph-supervisor's replay learned hints
then recomputed more than LRU). The hint declares the leading system/developer messages as
``fixed_prefix`` (chat): an agent's first call in a session tags its system prompt already, which
every session of that agent tags alike, so the prompt is ranked by the most urgent session (a
node's steps are the min over its tags). Raw-text prompts declare none: the rule alone decides.

**A declared hint always wins.** A request with one is passed through unchanged, and the session it
belongs to is the orchestrator's from then on: its later requests get no learned hint.

``ended()`` gives a ``StepsUpdate(done=True)`` per session that ended, for the host to apply. Not
thread-safe: the host's event loop is the only caller. Never raises on what a client sends.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Literal, Mapping, NamedTuple

from kvflow_orch.protocol import KVFlowHint, StepsUpdate

from .agents import AgentRegistry
from .config import LearnerConfig
from .requests import read_chat, read_completion, turn_key
from .sessions import SessionTable
from .transitions import TransitionModel

__all__ = ["TrafficLearner", "Learned", "LEARNER_COUNTERS", "session_agent"]

LEARNER_COUNTERS = ("declared_hint_requests", "learned_hint_requests", "unhinted_requests",
                    "declared_session_requests", "bad_session_keys")
"""Monotonic counts: requests with a declared hint, given a learned one, left without (of them,
``declared_session_requests`` belong to a declared session); session keys of a wrong type."""


def session_agent(agent: str, session_id: str) -> str:
    """The name a learned hint gives ``agent`` within session ``session_id`` (module docstring)."""
    return f"{agent}@{session_id}"


class Learned(NamedTuple):
    hint: KVFlowHint | None
    """What the host hands its intake."""
    source: Literal["declared", "learned", "unhinted"]
    session_id: str | None = None
    agent: str | None = None
    """The learned agent (the app-wide name; the hint names it per session, :func:`session_agent`)."""
    link: tuple[int, int] | None = None
    """Where the request's conversation stood (for :meth:`TrafficLearner.reply`)."""


class TrafficLearner:
    def __init__(self, config: LearnerConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = cfg = config or LearnerConfig()
        self.agents = AgentRegistry(cfg.max_agents, cfg.max_agents_per_group, cfg.min_shared_chars)
        self.sessions = SessionTable(cfg.max_sessions, cfg.session_ttl_s, cfg.max_index_entries, clock)
        self.models: dict[str, TransitionModel] = {}
        self.counters: Counter[str] = Counter({name: 0 for name in LEARNER_COUNTERS})
        self._done: list[StepsUpdate] = []
        self._hints: dict[tuple[str, str], KVFlowHint] = {}

    def observe(self, body: Mapping[str, Any], *, route: Literal["chat", "completions"] = "chat",
                headers: Mapping[str, str] = {}, declared: KVFlowHint | None = None) -> Learned:
        """The hint for one arriving request (module docstring). ``body``: its JSON object."""
        view = read_chat(body, headers) if route == "chat" else read_completion(body, headers)
        self.counters["bad_session_keys"] += view.bad_key
        session, link = self.sessions.session_of(view, self.config.namespace)
        self._end_sessions()
        if declared is not None:
            session.declared = True
            self.counters["declared_hint_requests"] += 1
            return Learned(declared, "declared", session.id, None, link)
        agent = self.agents.identify(view)
        model = self._model(session.namespace)
        if session.agent is not None:
            model.observe(session.agent, agent)
        session.agent = agent
        if session.declared:
            self.counters["declared_session_requests"] += 1
            self.counters["unhinted_requests"] += 1
            return Learned(None, "unhinted", session.id, agent, link)
        self.counters["learned_hint_requests"] += 1
        messages = body.get("messages")
        lead = len(messages) - len(view.messages) if route == "chat" and isinstance(messages, list) else 0
        hint = self._hint(session.id, session.namespace, agent, model.steps(agent), lead or None)
        return Learned(hint, "learned", session.id, agent, link)

    def unhinted(self) -> None:
        """Count a request the learner did not see (the switch is off for it, a route it does not read)."""
        self.counters["unhinted_requests"] += 1

    def reply(self, learned: Learned, message: Mapping[str, Any]) -> None:
        """The reply to ``learned``'s request, as an assistant message (``content``, ``tool_calls``)
        or ``{"content": text}`` for a completion."""
        if learned.session_id is None:
            return
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
        call_ids = [str(c.get("id", "")) for c in calls if isinstance(c, Mapping)]
        turn = turn_key({"role": "assistant", "content": text, "tool_calls": calls})
        self.sessions.record_reply(learned.session_id, learned.link, turn, text, call_ids)

    def ended(self) -> list[StepsUpdate]:
        """``done`` updates for the learned sessions that ended since the last call."""
        self._end_sessions()
        out, self._done = self._done, []
        return out

    def stats(self) -> dict[str, int]:
        """Counters plus ``learned_agents`` and ``live_sessions`` (gauges)."""
        return {**self.counters, "learned_agents": len(self.agents), "live_sessions": len(self.sessions)}

    def graph(self) -> dict[str, Any]:
        """Learned agents and transitions per namespace (no prompt text, no session ids)."""
        return {"agents": [{"name": n, "requests": r, "stable_chars": c} for n, r, c in self.agents.agents()],
                "namespaces": {ns: {"transitions": m.transitions()} for ns, m in self.models.items()}}

    # ---- internal helpers ----------------------------------------------------------------
    def _model(self, namespace: str) -> TransitionModel:
        model = self.models.get(namespace)
        if model is None:
            cfg = self.config
            model = self.models[namespace] = TransitionModel(cfg.decay, cfg.max_model_agents, cfg.max_successors,
                                                             cfg.prior, cfg.refresh)
        return model

    def _hint(self, workflow_id: str, namespace: str, agent: str, steps: dict[str, float],
              fixed_prefix: int | None) -> KVFlowHint:
        """The learned hint of ``agent`` in session ``workflow_id``, its steps named per session.
        Validated once per agent (validating a step map costs more than the rest of a request's
        learning): later hints are copies with the session's names and the model's current steps.
        Those were checked: names come from the registry (a few hyphenated words) and the session
        table, and step math's values are valid steps by construction (non-negative, rounded,
        ``inf`` where an agent cannot follow)."""
        scoped = {session_agent(a, workflow_id): v for a, v in steps.items()}
        update = {"workflow_id": workflow_id, "agent": session_agent(agent, workflow_id), "steps": scoped,
                  "fixed_prefix": fixed_prefix}
        cached = self._hints.get((namespace, agent))
        if cached is None:
            if len(self._hints) >= self.config.max_agents:
                self._hints.clear()
            cached = self._hints[namespace, agent] = KVFlowHint(**update, namespace=namespace)
            return cached
        return cached.model_copy(update=update)

    def _end_sessions(self) -> None:
        self.sessions.expire()
        for session in self.sessions.ended():
            if session.agent is not None:
                self._model(session.namespace).observe(session.agent, None)
            if not session.declared and len(self._done) < self.config.max_sessions:
                self._done.append(StepsUpdate(workflow_id=session.id, namespace=session.namespace, done=True))
