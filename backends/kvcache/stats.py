"""Monotonic counters of the cache brain: they only ever grow."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["CacheStats"]


@dataclass
class CacheStats:
    device_hit_tokens: int = 0       # prompt tokens found on device at admission (not prefetched)
    host_hit_tokens: int = 0         # prompt tokens that had to be loaded at admission (the stall)
    prefetch_hit_tokens: int = 0     # prompt tokens found on device thanks to a prefetch
    recomputed_tokens: int = 0       # prompt tokens not cached at all (misses)
    prefetched_tokens: int = 0       # tokens loaded by completed prefetches
    prefetch_unused_tokens: int = 0  # prefetched tokens evicted (or failed) before any hit
    evicted_device_tokens: int = 0   # tokens whose device copy was freed (demoted or dropped)
    evicted_host_tokens: int = 0     # tokens whose host copy was freed

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
