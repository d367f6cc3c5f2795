"""Sessions (workflow instances) of plain traffic: by the client's key, else by content.

A request names its session with a key (:mod:`.requests` lists the fields), or its content links it
to an earlier request's session, strongest evidence first:

1. it **extends an earlier conversation**: its messages after the lead begin with all the messages
   of an earlier request (that request's reply included, once it is known), two messages or more;
2. it **carries an earlier reply**: a line of an earlier reply (24 characters or more), or the id of
   a tool call it made, appears in one of its messages (CrewAI hands a task's output to the next
   task in the prompt; group chats pass every reply on); the session with most such lines wins;
3. it shares only its first message with an earlier request (one task handed to several agents).

Otherwise it starts a session. Sessions are bounded in number and expire after ``ttl_s`` without a
request; both endings are reported (:meth:`SessionTable.ended`) so the transition model learns
where sessions end and the host can tell its hint table the workflow is done. The content index
is bounded too; an entry whose session is gone is ignored.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from backends.kvcache.bounded import BoundedLRU

from .requests import RequestView, digest

__all__ = ["Session", "SessionTable", "MIN_LINE_CHARS"]

MIN_LINE_CHARS = 24
_LINES_PER_REPLY = 16
_LINES_PER_REQUEST = 512


@dataclass
class Session:
    id: str
    namespace: str
    last_seen: float
    agent: str | None = None
    """The agent of the session's latest request."""
    requests: int = 0
    declared: bool = False
    """A request of this session carried a declared hint: learned hints stay out of it."""


class SessionTable:
    def __init__(self, max_sessions: int, ttl_s: float, max_index: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._sessions: BoundedLRU[str, Session] = BoundedLRU(max_sessions)
        self._by_key: BoundedLRU[bytes, str] = BoundedLRU(max_sessions)
        self._by_turns: BoundedLRU[bytes, str] = BoundedLRU(max_index)
        self._by_line: BoundedLRU[bytes, str] = BoundedLRU(max_index)
        self._ended: list[Session] = []
        self._serial = 0

    def session_of(self, view: RequestView, namespace: str) -> tuple[Session, tuple[bytes, ...]]:
        """The session ``view`` belongs to (a new one when nothing links it), touched; and the
        digests of its conversation prefixes (for :meth:`record_reply`)."""
        now = self.clock()
        self.expire(now)
        prefixes = _prefix_digests(view.turns)
        sid = self._linked(view, prefixes)
        session = self._sessions.get(sid) if sid is not None else None
        if session is None:
            self._serial += 1
            session = Session(f"learned-{self._serial}", namespace, now)
        session.last_seen, session.requests = now, session.requests + 1
        for _, old in self._sessions.put(session.id, session):
            self._ended.append(old)
        if view.session_key is not None:
            self._by_key.put(view.session_key, session.id)
        for d in prefixes:
            self._by_turns.put(d, session.id)
        return session, prefixes

    def record_reply(self, session_id: str, prefixes: tuple[bytes, ...], reply_turn: str, reply_text: str,
                     call_ids: Iterable[str]) -> None:
        """The reply of a request of ``session_id`` is known: index it for the requests that carry it."""
        if session_id not in self._sessions:
            return
        last = prefixes[-1] if prefixes else b""
        self._by_turns.put(digest(last, reply_turn), session_id)
        for line in _lines(reply_text)[:_LINES_PER_REPLY]:
            self._by_line.put(digest("line", line), session_id)
        for call_id in call_ids:
            if call_id:
                self._by_line.put(digest("call", call_id), session_id)

    def expire(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        while (oldest := self._sessions.oldest()) is not None and now - oldest[1].last_seen > self.ttl_s:
            self._ended.append(self._sessions.pop_oldest()[1])

    def ended(self) -> list[Session]:
        """Sessions that expired or were forgotten since the last call."""
        out, self._ended = self._ended, []
        return out

    def __len__(self) -> int:
        return len(self._sessions)

    # ---- internal helpers ----------------------------------------------------------------
    def _linked(self, view: RequestView, prefixes: tuple[bytes, ...]) -> str | None:
        if view.session_key is not None:
            sid = self._by_key.get(view.session_key)
            return sid if sid in self._sessions else None  # a key never joins a session by content
        for depth in range(len(prefixes), 1, -1):
            sid = self._by_turns.get(prefixes[depth - 1])
            if sid in self._sessions:
                return sid
        votes: Counter[str] = Counter()
        carried = [digest("line", line) for text in view.texts for line in _lines(text)][-_LINES_PER_REQUEST:]
        for key in carried + [digest("call", c) for c in view.call_ids[-_LINES_PER_REQUEST:]]:
            sid = self._by_line.get(key)
            if sid in self._sessions:
                votes[sid] += 1
        if votes:
            return max(votes, key=lambda s: (votes[s], self._sessions[s].last_seen))
        first = self._by_turns.get(prefixes[0]) if prefixes else None
        return first if first in self._sessions else None


def _prefix_digests(turns: tuple[str, ...]) -> tuple[bytes, ...]:
    out, last = [], b""
    for turn in turns:
        last = digest(last, turn)
        out.append(last)
    return tuple(out)


def _lines(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if len(s) >= MIN_LINE_CHARS]
