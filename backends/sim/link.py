"""One direction of the host<->device link: a serial channel where demand copies go first.

The link is full duplex, so the simulator owns one :class:`Link` per direction and they never
contend. Within a direction copies run one at a time; a demand copy (a load a scheduled request is
waiting for) is committed at once behind the copies already committed, while background copies
(prefetches, write-through offloads) wait until the channel is idle. A committed copy is never
preempted, so its completion time is known when it is committed.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from .events import EventQueue

__all__ = ["Link"]

Done = Callable[[], Any]


class Link:
    def __init__(self, events: EventQueue, seconds_for: Callable[[int], float]) -> None:
        self.events = events
        self.seconds_for = seconds_for
        self.busy_until = 0.0
        self.busy_s = 0.0
        self._background: deque[tuple[int, Done]] = deque()

    def demand(self, tokens: int, done: Done) -> float:
        """Commit a copy now (behind committed ones); returns its completion time."""
        return self._commit(tokens, done)

    def background(self, tokens: int, done: Done) -> None:
        """Queue a copy that starts only when nothing else is committed."""
        self._background.append((tokens, done))
        self._pump()

    def _commit(self, tokens: int, done: Done) -> float:
        start = max(self.events.now, self.busy_until)
        seconds = self.seconds_for(tokens)
        self.busy_until = start + seconds
        self.busy_s += seconds
        self.events.schedule(self.busy_until, self._finish, done)
        return self.busy_until

    def _finish(self, done: Done) -> None:
        done()
        self._pump()

    def _pump(self) -> None:
        if self._background and self.busy_until <= self.events.now:
            tokens, done = self._background.popleft()
            self._commit(tokens, done)
