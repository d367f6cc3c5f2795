"""Sessions (workflow instances) of plain traffic: by the client's key, else by content.

A request names its session with a key (:mod:`.requests` lists the fields), or its content links it
to an earlier request's session, strongest evidence first:

1. it **extends an earlier conversation**: its messages after the lead begin with all the messages
   of an earlier request (that request's reply included, once it is known), two messages or more.
   A conversation is known by its length and its first and last messages, and a request is read
   back from its end by at most 32 messages: what a request costs must not grow with its
   conversation (a chat's 200th turn costs what its 2nd does);
2. it **carries an earlier reply**: a line of an earlier reply (24 characters or more), or the id of
   a tool call it made, appears in one of its messages (CrewAI hands a task's output to the next
   task in the prompt; group chats pass every reply on); the session with most such lines wins.
   A line is kept for the last few sessions whose replies had it (a small model gives several
   users the same reply): on a tie the session the request's first message names wins (rule 3's
   evidence), then the latest. The request is read back from its end, a bounded amount;
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

from .requests import RequestView

__all__ = ["Session", "SessionTable", "MIN_LINE_CHARS"]

MIN_LINE_CHARS = 24
_LINES_PER_REPLY = 8
_LINES_PER_REQUEST = 128
_SESSIONS_PER_LINE = 4
_SCAN_TURNS = 32
"""Messages read back from a request's end: how far a request may extend an earlier one (a reply,
tool results, a user turn) and where echoed tool call ids are looked for."""
_SCAN_CHARS = 64 * 1024
"""Text read back from a request's end for carried reply lines."""

Link = tuple[int, int] | None
"""Where a request's conversation stands: the key of its first message after the lead, and how
many messages it has (None: it has none)."""


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
        self._by_turns: BoundedLRU[int, str] = BoundedLRU(max_index)
        self._by_line: BoundedLRU[int, tuple[str, ...]] = BoundedLRU(max_index)
        """Sessions whose replies had a line (or made a tool call), the latest last."""
        self._ended: list[Session] = []
        self._serial = 0

    def session_of(self, view: RequestView, namespace: str) -> tuple[Session, Link]:
        """The session ``view`` belongs to (a new one when nothing links it), touched; and where its
        conversation stands (for :meth:`record_reply`)."""
        now = self.clock()
        self.expire(now)
        depth = len(view.messages)
        link = (view.turn(0), depth) if depth else None
        sid = self._linked(view, link)
        session = self._sessions.get(sid) if sid is not None else None
        if session is None:
            self._serial += 1
            session = Session(f"learned-{self._serial}", namespace, now)
        session.last_seen, session.requests = now, session.requests + 1
        for _, old in self._sessions.put(session.id, session):
            self._ended.append(old)
        if view.session_key is not None:
            self._by_key.put(view.session_key, session.id)
        if link is not None:
            first = _first_key(link[0])
            if self._by_turns.get(first) not in self._sessions:  # the session that sent it first keeps it
                self._by_turns.put(first, session.id)
            if depth > 1:
                self._by_turns.put(_depth_key(link[0], depth, view.turn(depth - 1)), session.id)
        return session, link

    def record_reply(self, session_id: str, link: Link, reply_turn: int, reply_text: str,
                     call_ids: Iterable[str]) -> None:
        """The reply of a request of ``session_id`` is known: index it for the requests that carry it."""
        if session_id not in self._sessions:
            return
        if link is not None:
            self._by_turns.put(_depth_key(link[0], link[1] + 1, reply_turn), session_id)
        keys = [hash(line) for line in _lines(reply_text)[:_LINES_PER_REPLY]]
        keys += [hash(("call", call_id)) for call_id in call_ids if call_id]
        for key in keys:
            had = self._by_line.get(key, ())
            if session_id not in had:
                self._by_line.put(key, (*had, session_id)[-_SESSIONS_PER_LINE:])

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
    def _linked(self, view: RequestView, link: Link) -> str | None:
        if view.session_key is not None:
            sid = self._by_key.get(view.session_key)
            return sid if sid in self._sessions else None  # a key never joins a session by content
        if link is not None:
            first, depth = link
            for d in range(depth, max(1, depth - _SCAN_TURNS), -1):
                sid = self._by_turns.get(_depth_key(first, d, view.turn(d - 1)))
                if sid in self._sessions:
                    return sid
        votes: Counter[str] = Counter()
        for key in self._carried(view):
            for sid in self._by_line.get(key, ()):
                if sid in self._sessions:
                    votes[sid] += 1
        first = self._by_turns.get(_first_key(link[0])) if link is not None else None
        if votes:
            return max(votes, key=lambda s: (votes[s], s == first, self._sessions[s].last_seen))
        return first if first in self._sessions else None

    @staticmethod
    def _carried(view: RequestView) -> list[int]:
        """Keys of the lines and tool call ids the request carries, the latest first, bounded."""
        keys = [hash(("call", c)) for c in view.call_ids(_SCAN_TURNS)]
        budget = _SCAN_CHARS
        for text in view.texts():
            keys += [hash(line) for line in reversed(_lines(text[-budget:]))]
            budget -= len(text)
            if budget <= 0 or len(keys) >= _LINES_PER_REQUEST:
                break
        return keys[:_LINES_PER_REQUEST]


def _first_key(first: int) -> int:
    return hash(("first", first))


def _depth_key(first: int, depth: int, last: int) -> int:
    """The key of a conversation ``depth`` messages long, by its first and last messages."""
    return hash((first, depth, last))


def _lines(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if len(s) >= MIN_LINE_CHARS]
