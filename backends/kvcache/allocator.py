"""Slot allocators for the device and the host pool: indices only; the engine owns the tensors.

Invariants: a slot is either free or handed out, never both; freeing a slot that is already free
(or out of range) raises :class:`SlotError` and changes nothing.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["SlotAllocator", "SlotError"]


class SlotError(ValueError):
    """A slot index that is out of range, or freed twice."""


class SlotAllocator:
    """LIFO free list over ``range(capacity)`` with a free bitmap for O(1) double-free checks."""

    __slots__ = ("name", "capacity", "_free", "_is_free")

    def __init__(self, capacity: int, name: str = "pool") -> None:
        if capacity < 0:
            raise ValueError(f"{name} capacity must be >= 0, got {capacity}")
        self.name = name
        self.capacity = capacity
        # Reversed so that a fresh pool hands out 0, 1, 2, ... (easier to read in tests and logs).
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * capacity

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return self.capacity - len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` free slots, or return ``None`` (taking nothing) when fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of slots ({n})")
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        for s in out:
            self._is_free[s] = 0
        return out

    def free(self, slots: Iterable[int]) -> None:
        """Return slots to the pool; all-or-nothing on a bad index or a double free."""
        slots = list(slots)
        seen: set[int] = set()
        for s in slots:
            if not (0 <= s < self.capacity):
                raise SlotError(f"{self.name} slot {s} is out of range [0, {self.capacity})")
            if self._is_free[s] or s in seen:
                raise SlotError(f"{self.name} slot {s} is already free (double free)")
            seen.add(s)
        for s in slots:
            self._is_free[s] = 1
        self._free.extend(slots)

    def is_free(self, slot: int) -> bool:
        return bool(self._is_free[slot])

    def free_slots(self) -> list[int]:
        return list(self._free)
