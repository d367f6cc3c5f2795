"""Frozen configuration of the embedded engine, built once at the edge (CLI, runtime, tests).

The cache brain's settings are not repeated here: ``EngineConfig.cache`` is the brain's own
:class:`~backends.kvcache.CacheConfig`, handed to it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from backends.kvcache import CacheConfig, policy_names

__all__ = ["EngineConfig", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The engine's pool sizes when a caller names none (CacheConfig itself has no host tier by default).
DEFAULT_DEVICE_TOKENS = 8192
DEFAULT_HOST_TOKENS = 32768


def _default_cache() -> CacheConfig:
    return CacheConfig(device_tokens=DEFAULT_DEVICE_TOKENS, host_tokens=DEFAULT_HOST_TOKENS)


@dataclass(frozen=True)
class EngineConfig:
    """``cache``: the brain's configuration (pool sizes in tokens, policy, prefetch, ...); its
    ``policy`` must be registered with :func:`backends.kvcache.register_policy`.

    ``device``/``dtype`` ``"auto"``: CUDA when available (bfloat16 there), else CPU in float32 (the
    bit-exact reference). ``chunk_tokens`` bounds the prefill work done per scheduler step, so running
    requests keep decoding while a long prompt is prefilled.
    """

    model: str = "tiny-random"
    cache: CacheConfig = field(default_factory=_default_cache)
    max_batch: int = 8
    chunk_tokens: int = 512
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.cache.policy not in policy_names(online=True):
            raise ValueError(f"policy must be one of {', '.join(policy_names(online=True))}, got {self.cache.policy!r}")
        if self.max_batch <= 0 or self.chunk_tokens <= 0:
            raise ValueError("max_batch and chunk_tokens must be > 0")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")

    @classmethod
    def build(cls, **options: Any) -> EngineConfig:
        """Flat keywords for callers: :class:`CacheConfig` field names (``device_tokens``,
        ``policy``, ``prefetch``, ...) go to ``cache``, with the engine's default pool sizes; the
        rest are the engine's own. An unknown name raises TypeError; a bad cache value ValueError."""
        cache = CacheConfig.from_options(options, base=_default_cache())
        return cls(cache=cache, **{k: v for k, v in options.items() if k not in CacheConfig.option_names()})

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return DTYPES[self.dtype]
