"""Exceptions of the cache brain: all are ValueError/RuntimeError subclasses naming the problem."""

from __future__ import annotations

from .allocator import SlotError

__all__ = ["CacheError", "LockError", "UnknownTaskError", "IntegrityError", "SlotError"]


class CacheError(ValueError):
    """Bad input to the cache (wrong slot counts, slots not held by the caller, ...)."""


class LockError(CacheError):
    """Unlock of a node that holds no lock (double unlock), or a lock on a removed node."""


class UnknownTaskError(CacheError):
    """``complete_*``/``fail_*`` for a task that is not in flight (already completed or failed)."""


class IntegrityError(AssertionError):
    """``check_integrity`` found a broken invariant; the message names the node or slot."""
