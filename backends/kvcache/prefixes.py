"""The agent registry: which fixed prefix of each agent a host has tagged.

One record per agent, in the host's own terms (the brain's token tuple, SGLang's radix key parts,
vLLM's block hashes), with its length in tokens. The registry is what the namespace cap counts
(each record's length goes to :meth:`~.hints.HintTable.note_fixed_tokens`) and what prefetch loads
(the records of agents due soon). It is bounded like every client-driven table
(:class:`~.bounded.BoundedLRU`): at most ``max_agents`` agents and ``max_tokens`` tokens, the least
recently tagged agent forgotten first, the newest always kept; a forgotten agent no longer costs
cap space. What a host does with a forgotten record (untag it in its tree, or let the tags go with
the tree's own eviction) is the host's.
"""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

from .bounded import Bound, BoundedLRU
from .hints import AgentRef, HintTable

__all__ = ["AgentPrefixes"]

P = TypeVar("P")


class AgentPrefixes(Generic[P]):
    max_agents = Bound("_records", "max_entries")
    max_tokens = Bound("_records", "max_weight")

    def __init__(self, hints: HintTable, max_agents: int, max_tokens: int) -> None:
        self.hints = hints
        self._records: BoundedLRU[AgentRef, tuple[P, int]] = BoundedLRU(
            max_agents, max_tokens, weigh=lambda record: record[1])

    def remember(self, ref: AgentRef, prefix: P, tokens: int,
                 within: tuple[AgentRef, int] | None = None) -> list[tuple[AgentRef, P]]:
        """``ref``'s fixed prefix is now ``prefix`` (``tokens`` long; 0 forgets it; ``within``: its
        first tokens are another agent's prefix, see :meth:`~.hints.HintTable.note_fixed_tokens`).
        Returns the records that no longer hold, for the host to untag: ``ref``'s previous one when
        it differs, then those forgotten to keep the bounds, oldest first."""
        if tokens < 0:
            raise ValueError(f"fixed-prefix length must be >= 0, got {tokens}")
        old = self._records.pop(ref)
        stale = [(ref, old[0])] if old is not None and (not tokens or old[0] != prefix) else []
        if not tokens:
            self.hints.note_fixed_tokens(ref, 0)
            return stale
        forgotten = self._records.put(ref, (prefix, tokens))
        self.hints.note_fixed_tokens(ref, tokens, within)
        for gone, _ in forgotten:
            self.hints.note_fixed_tokens(gone, 0)
        return stale + [(gone, record[0]) for gone, record in forgotten]

    def get(self, ref: AgentRef) -> P | None:
        record = self._records.get(ref)
        return None if record is None else record[0]

    def tokens(self, ref: AgentRef) -> int:
        record = self._records.get(ref)
        return 0 if record is None else record[1]

    @property
    def token_count(self) -> int:
        return self._records.weight

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, ref: object) -> bool:
        return ref in self._records

    def __iter__(self) -> Iterator[AgentRef]:
        """Agents oldest tagged first."""
        return iter(self._records)
