"""A map bounded by entries and by weight, forgetting the least recently stored entry first.

Every per-agent or per-workflow table a server keeps for its clients (segmentation history, fixed
prefixes, step maps, agent tags) must stay bounded whatever clients send, and every one of them
forgets the same way: :class:`BoundedLRU`. Rules:

* ``put`` stores an entry as the newest (replacing the key's old value), then forgets the oldest
  entries while there are more than ``max_entries`` or their weights sum to more than
  ``max_weight``;
* the newest entry always stays, even when it alone is over the weight bound: forgetting what a
  caller just stored would leave it acting on a record that no longer exists;
* reading (``get``, ``in``, iteration) never changes the order; iteration is oldest first.

Values may be mutable: a caller that changed a value in place stores it again with ``put`` so that
its weight is counted anew.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["BoundedLRU", "Bound"]

K = TypeVar("K")
V = TypeVar("V")


def _one(_: object) -> int:
    return 1


class BoundedLRU(Generic[K, V]):
    """``weigh(value)`` gives an entry's weight (1 each by default: a bound on entries alone);
    ``max_weight=None`` leaves the weight unbounded. The bounds are attributes: a change applies
    from the next ``put``."""

    __slots__ = ("max_entries", "max_weight", "_weigh", "_entries", "_weight")

    def __init__(self, max_entries: int, max_weight: int | None = None, weigh: Callable[[V], int] = _one) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be > 0, got {max_entries}")
        if max_weight is not None and max_weight < 0:
            raise ValueError(f"max_weight must be >= 0, got {max_weight}")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Store ``value`` under ``key`` as the newest entry; returns the entries forgotten to keep
        the bounds, oldest first (never this one; the key's replaced value is not among them)."""
        self.pop(key)
        weight = self._weigh(value)
        self._entries[key] = (value, weight)
        self._weight += weight
        gone: list[tuple[K, V]] = []
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self._over_weight()):
            old, (old_value, old_weight) = self._entries.popitem(last=False)
            self._weight -= old_weight
            gone.append((old, old_value))
        return gone

    def pop(self, key: K, default: V | None = None) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return default
        self._weight -= entry[1]
        return entry[0]

    def pop_oldest(self) -> tuple[K, V]:
        """Forget and return the oldest entry (``KeyError`` when empty)."""
        if not self._entries:
            raise KeyError("pop_oldest from an empty BoundedLRU")
        key, (value, weight) = self._entries.popitem(last=False)
        self._weight -= weight
        return key, value

    def oldest(self) -> tuple[K, V] | None:
        """The oldest entry without forgetting it; ``None`` when empty."""
        for key, (value, _) in self._entries.items():
            return key, value
        return None

    def get(self, key: K, default: V | None = None) -> V | None:
        entry = self._entries.get(key)
        return default if entry is None else entry[0]

    def items(self) -> Iterator[tuple[K, V]]:
        return ((key, value) for key, (value, _) in self._entries.items())

    @property
    def weight(self) -> int:
        """Sum of the stored entries' weights."""
        return self._weight

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __getitem__(self, key: K) -> V:
        return self._entries[key][0]

    def _over_weight(self) -> bool:
        return self.max_weight is not None and self._weight > self.max_weight


class Bound:
    """A class attribute that reads and sets one bound (``max_entries`` or ``max_weight``) of a
    :class:`BoundedLRU` its instances keep under ``table``: the owner's bounds stay attributes as
    callers know them, with one place that holds them."""

    def __init__(self, table: str, bound: str) -> None:
        self.table, self.bound = table, bound

    def __get__(self, obj: object, owner: type | None = None) -> int | None:
        if obj is None:
            return self  # type: ignore[return-value]
        return getattr(getattr(obj, self.table), self.bound)

    def __set__(self, obj: object, value: int | None) -> None:
        setattr(getattr(obj, self.table), self.bound, value)
