"""A learner of agents, sessions and steps from plain OpenAI traffic (issue 23), for every host.

Standard library, the wire contract and the brain's :class:`~backends.kvcache.bounded.BoundedLRU`
only, so the embedded server, the vLLM routes plugin and SGLang's HTTP hooks import it alike:

    from backends.learn import TrafficLearner
    learner = TrafficLearner()
    hint = learner.observe(body, route="chat", headers=headers, declared=hint).hint

Modules: :mod:`.requests` (what is read of a request; the session keys accepted), :mod:`.agents`
(fingerprints and the stable boundary), :mod:`.sessions`, :mod:`.transitions`, :mod:`.steps` (the
seam to learned routing's step math), :mod:`.learner` (the facade), :mod:`.config`.
"""

from __future__ import annotations

from .config import LEARNED_NAMESPACE, LearnerConfig
from .learner import LEARNER_COUNTERS, Learned, TrafficLearner, session_agent
from .requests import SESSION_KEY_FIELDS, SESSION_KEY_HEADERS, session_headers

__all__ = ["TrafficLearner", "Learned", "LearnerConfig", "LEARNED_NAMESPACE", "LEARNER_COUNTERS",
           "SESSION_KEY_FIELDS", "SESSION_KEY_HEADERS", "session_headers", "session_agent"]
