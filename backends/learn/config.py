"""Frozen settings of the traffic learner, built once at the edge (``kvflow serve``, a plugin)."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["LearnerConfig", "LEARNED_NAMESPACE"]

LEARNED_NAMESPACE = "learned"


@dataclass(frozen=True)
class LearnerConfig:
    namespace: str = LEARNED_NAMESPACE
    """The hint namespace of learned agents (one transition model per namespace)."""
    max_sessions: int = 10_000
    """Live sessions kept; the least recently active is ended beyond it."""
    session_ttl_s: float = 600.0
    """A session without a request for this long has ended."""
    max_agents: int = 4096
    """Agents (fingerprints) kept; the least recently seen is forgotten beyond it."""
    max_agents_per_group: int = 16
    """Agents kept per model and tool set: a request whose lead matches no agent exactly compares it
    with each of them (a framework app has a handful per model and tool set)."""
    min_shared_chars: int = 256
    """A lead sharing this many characters with an agent's stable prefix joins it even when that is
    less than half of the prefix (see :mod:`.agents`)."""
    max_index_entries: int = 65_536
    """Conversation and reply digests kept for linking sessions by content."""
    decay: float = 0.97
    """Per-observation decay of an agent's transition row."""
    max_model_agents: int = 64
    """Agents with a transition row per namespace (the solve is cubic in them)."""
    max_successors: int = 16
    """Successors kept per agent's row."""
    prior: float = 0.5
    """Pseudo-count added to every observed successor and to the end of a session."""
    refresh: int = 32
    """Observations between two solves of the expected steps (at least). A solve and the hints
    built from it cost a few requests' worth of learning each (``benchmarks/learner_cost.py``), so
    one every 32 keeps their share of a request's cost small; the steps lag that many observations."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "namespace" and not value > 0:
                raise ValueError(f"{f.name} must be > 0, got {value}")
        if not self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if not self.namespace or len(self.namespace) > 256:
            raise ValueError("namespace must be a non-empty string of at most 256 characters")
