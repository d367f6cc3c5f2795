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
learner's namespace, workflow ``learned-N`` (one per session), the agent's expected steps from the
session's state (learned routing's semantics, :mod:`.steps`) and no ``fixed_prefix``: the intake's
boundary rule (what the agent's requests share) decides it, as KVFlow's heuristic does.

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

__all__ = ["TrafficLearner", "Learned", "LEARNER_COUNTERS"]

LEARNER_COUNTERS = ("declared_hint_requests", "learned_hint_requests", "unhinted_requests",
                    "declared_session_requests", "bad_session_keys")
"""Monotonic counts: requests with a declared hint, given a learned one, left without (of them,
``declared_session_requests`` belong to a declared session); session keys of a wrong type."""


class Learned(NamedTuple):
    hint: KVFlowHint | None
    """What the host hands its intake."""
    source: Literal["declared", "learned", "unhinted"]
    session_id: str | None = None
    agent: str | None = None
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
        self._hints: dict[tuple[str, str], tuple[dict[str, float], KVFlowHint]] = {}

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
        return Learned(self._hint(session.id, session.namespace, agent, model.steps(agent)), "learned",
                       session.id, agent, link)

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

    def _hint(self, workflow_id: str, namespace: str, agent: str, steps: dict[str, float]) -> KVFlowHint:
        """The learned hint, validated once per agent (validating a step map costs more than the
        rest of a request's learning). Later hints are copies with their own workflow id and the
        model's current steps: the names were checked, and step math's values are valid steps by
        construction (non-negative, rounded, ``inf`` where an agent cannot follow)."""
        cached = self._hints.get((namespace, agent))
        if cached is not None:
            if cached[0] is steps:
                return cached[1].model_copy(update={"workflow_id": workflow_id})
            hint = cached[1].model_copy(update={"workflow_id": workflow_id, "steps": steps})
        else:
            if len(self._hints) >= self.config.max_agents:
                self._hints.clear()
            hint = KVFlowHint(workflow_id=workflow_id, namespace=namespace, agent=agent, steps=steps)
        self._hints[namespace, agent] = (steps, hint)
        return hint

    def _end_sessions(self) -> None:
        self.sessions.expire()
        for session in self.sessions.ended():
            if session.agent is not None:
                self._model(session.namespace).observe(session.agent, None)
            if not session.declared and len(self._done) < self.config.max_sessions:
                self._done.append(StepsUpdate(workflow_id=session.id, namespace=session.namespace, done=True))
