"""Frozen configuration of the embedded engine, built once at the edge (CLI, runtime, tests)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.kvcache import DEFAULT_HINT_TTL_S, CacheConfig

__all__ = ["EngineConfig", "POLICIES", "DTYPES"]

POLICIES = ("lru", "kvflow")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    """Capacities are in tokens; ``host_tokens == 0`` means no host tier (evicted KV is dropped).

    ``device``/``dtype`` ``"auto"``: CUDA when available (bfloat16 there), else CPU in float32 (the
    bit-exact reference). ``chunk_tokens`` bounds the prefill work done per scheduler step, so running
    requests keep decoding while a long prompt is prefilled.
    """

    model: str = "tiny-random"
    device_tokens: int = 8192
    host_tokens: int = 32768
    policy: str = "kvflow"
    prefetch: bool = True
    max_batch: int = 8
    chunk_tokens: int = 512
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    prefetch_lookahead: int = 1
    max_inflight_loads: int = 4
    write_through: bool = False
    hint_ttl_s: float = DEFAULT_HINT_TTL_S
    """Seconds after its last update a workflow that never sent ``done`` is forgotten."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        self.cache_config()  # the brain validates the fields it shares with the engine
        if self.max_batch <= 0 or self.chunk_tokens <= 0:
            raise ValueError("max_batch and chunk_tokens must be > 0")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")

    def cache_config(self) -> CacheConfig:
        """The cache brain's configuration for this engine."""
        return CacheConfig(
            device_tokens=self.device_tokens, host_tokens=self.host_tokens, policy=self.policy,
            prefetch=self.prefetch, prefetch_lookahead=self.prefetch_lookahead,
            max_inflight_loads=self.max_inflight_loads, write_through=self.write_through,
            hint_ttl_s=self.hint_ttl_s,
        )

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return DTYPES[self.dtype]
