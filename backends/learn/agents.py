"""Agents of plain traffic: a fingerprint of each request's stable leading part, with a learned boundary.

An agent is what recurs at the head of requests: the leading system/developer messages (or a
completion's prompt), under one model and one set of tools (names and schema shapes). Two readings make
the fingerprint robust to text that changes from call to call inside a system prompt:

* **Masking.** Runs of digits (dates, times, counters, ids) read as one ``0`` before anything is
  compared: "Today is 2025-05-01 12:03" and "Today is 2025-05-02 09:41" are the same text.
* **The stable boundary** (KVFlow's cache-hit-history heuristic, on text): each agent keeps the
  prefix its requests have shared so far. A request whose lead matches no agent exactly joins the
  agent it shares the longest prefix with, when that prefix (a) goes past the point where the
  agent's prefix parts from every other agent's of the same model and tools (what tells agents
  apart is never taken for dynamic text), and (b) is at least half of the agent's stable prefix or
  ``min_shared_chars`` long. The agent's stable prefix then shrinks to what is shared.

**A follow-up call without tools** is the agent that made the tool call: frameworks drop the tools
block on the call that reads a tool's result (AutoGen's ``reflect_on_tool_use``), so a chat request
with no tools whose masked lead is, exactly, a lead an agent with tools sent (same model)
belongs to that agent. Only where that is unambiguous: when agents with different tools send the
same lead, a call without tools cannot say whose it is and stays an agent of its own; and an agent
without tools seen with that lead first keeps its calls (agents are never merged after the fact).

A lead that shares too little (dynamic text near its start) makes a new agent: bounded, never an
error. Names are readable: the first words of the role ("You are a Senior Research Analyst." ->
``senior-research-analyst``), made unique with ``-2``, ``-3``...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends.kvcache.bounded import BoundedLRU

from .requests import NO_TOOLS, RequestView, digest

__all__ = ["AgentRegistry", "agent_name_of"]

_DIGITS = re.compile(r"\d+")
_ROLE_OPENERS = re.compile(r"^\s*(?:(?:you\s+are|you're|act\s+as|your\s+role\s+is|role\s*:|as)\s+)?"
                           r"(?:(?:a|an|the)\s+)?", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z0-9]+")
_NAME_WORDS = 3


@dataclass
class _Template:
    name: str
    stable: str
    requests: int = 0


class AgentRegistry:
    """Agents by fingerprint. Bounded: at most ``max_agents`` agents (and exact fingerprints), at most
    ``max_per_group`` agents per model and tool set; the least recently seen is forgotten first."""

    def __init__(self, max_agents: int, max_per_group: int, min_shared_chars: int) -> None:
        self.max_per_group = max_per_group
        self.min_shared_chars = min_shared_chars
        self._exact: BoundedLRU[bytes, str] = BoundedLRU(max_agents)
        self._verbatim: BoundedLRU[int, tuple[bytes, str]] = BoundedLRU(max_agents)
        self._groups: BoundedLRU[bytes, BoundedLRU[str, _Template]] = BoundedLRU(max_agents)
        self._live: BoundedLRU[str, _Template] = BoundedLRU(max_agents)
        self._next_suffix: BoundedLRU[str, int] = BoundedLRU(max_agents)
        self._tooled: BoundedLRU[bytes, tuple[bytes, str] | None] = BoundedLRU(max_agents)
        """Latest masked leads of agents with tools, by model: the agent, or None where agents with
        different tools sent it (a call without tools and that lead is nobody's follow-up then)."""

    def identify(self, view: RequestView) -> str:
        """The agent of ``view`` (learned on the way: a new agent, or a shorter stable prefix)."""
        verbatim = hash((view.model, view.tools, view.lead))  # a lead seen before, byte for byte: no masking
        known = self._verbatim.get(verbatim)
        if known is not None and (group := self._groups.get(known[0])) is not None and known[1] in group \
                and known[1] in self._live:
            return self._seen(known[0], group, group[known[1]])
        lead = _DIGITS.sub("0", view.lead)
        group_key = digest(view.model, str(view.tools))
        exact_key = digest(group_key, lead)
        name = self._exact.get(exact_key)
        group = self._groups.get(group_key)
        if name is not None and group is not None and name in group and name in self._live:
            self._verbatim.put(verbatim, (group_key, name))
            return self._seen(group_key, group, group[name])
        lead_key = digest(view.model, lead)
        if view.tools == NO_TOOLS and (followed := self._follow_up(lead_key)) is not None:
            return followed
        if group is None:
            group = BoundedLRU(self.max_per_group)
        template = self._joined(group, lead)
        if template is None:
            template = _Template(self._unique(agent_name_of(view.lead)), lead)
        self._exact.put(exact_key, template.name)
        self._verbatim.put(verbatim, (group_key, template.name))
        if view.tools != NO_TOOLS and view.completion is None:
            mine = (group_key, template.name)
            self._tooled.put(lead_key, mine if self._tooled.get(lead_key, mine) == mine else None)
        return self._seen(group_key, group, template)

    def __len__(self) -> int:
        return len(self._live)

    def agents(self) -> list[tuple[str, int, int]]:
        """``(name, requests, stable prefix chars)`` of every agent, least recently seen first."""
        return [(t.name, t.requests, len(t.stable)) for t in (v for _, v in self._live.items())]

    # ---- internal helpers ----------------------------------------------------------------
    def _follow_up(self, lead_key: bytes) -> str | None:
        """The agent with tools whose latest lead this call without tools repeats, when exactly one
        does (module docstring). Looked up on every such call, not cached verbatim: another agent with
        other tools may send the same lead later, and the call is nobody's from then on."""
        owner = self._tooled.get(lead_key)
        group = self._groups.get(owner[0]) if owner is not None else None
        if owner is None or group is None or owner[1] not in group or owner[1] not in self._live:
            return None
        return self._seen(owner[0], group, group[owner[1]])

    def _joined(self, group: BoundedLRU[str, _Template], lead: str) -> _Template | None:
        """The agent of ``group`` that ``lead`` belongs to by the boundary rule (shrinking its
        stable prefix), or None."""
        scored = [(common_prefix(lead, t.stable), t) for _, t in group.items() if t.name in self._live]
        if not scored:
            return None
        shared, best = max(scored, key=lambda st: st[0])
        if shared == 0 or not (shared * 2 >= len(best.stable) or shared >= self.min_shared_chars):
            return None
        if any(common_prefix(best.stable, t.stable) >= shared for _, t in scored if t is not best):
            return None  # what the lead shares does not tell ``best`` from another agent
        best.stable = best.stable[:shared]
        return best

    def _seen(self, group_key: bytes, group: BoundedLRU[str, _Template], template: _Template) -> str:
        template.requests += 1
        group.put(template.name, template)
        self._groups.put(group_key, group)
        self._live.put(template.name, template)
        return template.name

    def _unique(self, base: str) -> str:
        n = self._next_suffix.get(base, 1)
        name = base if n == 1 else f"{base}-{n}"
        while name in self._live:
            n += 1
            name = f"{base}-{n}"
        self._next_suffix.put(base, n + 1)
        return name


def agent_name_of(lead: str) -> str:
    """The first words of the role, lower case and hyphenated; ``agent`` when there are none."""
    first = re.split(r"[.!?\n:;]", _ROLE_OPENERS.sub("", lead, count=1), maxsplit=1)[0]
    words = _WORD.findall(first)[:_NAME_WORDS] or _WORD.findall(lead)[:_NAME_WORDS]
    return "-".join(w.lower() for w in words)[:64] or "agent"


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection over slices (C-speed comparisons)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
