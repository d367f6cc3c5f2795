"""A deterministic discrete-event queue.

Events fire in time order; events at the same time fire in the order they were scheduled (a
monotonic sequence number breaks ties), so a simulation with the same inputs replays exactly.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable

__all__ = ["EventQueue"]


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.now = 0.0

    def schedule(self, at: float, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action(*args)`` at time ``at`` (never earlier than now)."""
        if at < self.now:
            raise ValueError(f"cannot schedule an event in the past ({at} < now {self.now})")
        heapq.heappush(self._heap, (at, self._seq, action, args))
        self._seq += 1

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)

    def pop(self) -> bool:
        """Advance to the earliest event and run it; False when none is left."""
        if not self._heap:
            return False
        at, _, action, args = heapq.heappop(self._heap)
        self.now = at
        action(*args)
        return True

    def run(self, until: float | None = None) -> None:
        while self._heap and (until is None or self._heap[0][0] <= until):
            self.pop()
