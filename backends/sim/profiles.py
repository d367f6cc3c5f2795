"""Hardware and model profiles: the data the roofline cost model runs on.

Profiles are JSON files under ``backends/sim/profiles/`` (``"kind": "hardware"`` or ``"model"``);
:func:`load_hardware` / :func:`load_model` accept a bundled name (``h100-sxm``) or a path to a JSON
file (what ``kvflow bench calibrate`` writes). Every number is in SI units: FLOP/s, bytes/s, bytes,
seconds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

__all__ = [
    "PROFILE_DIR",
    "HardwareProfile",
    "ModelProfile",
    "ProfileError",
    "load_hardware",
    "load_model",
    "available_profiles",
    "device_kv_tokens",
]

PROFILE_DIR = Path(__file__).with_name("profiles")


class ProfileError(ValueError):
    """A profile that cannot be found or does not describe a usable device or model."""


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator and its host link.

    ``link_bandwidth`` is per direction (the link is full duplex); a KV copy moves
    ``link_bandwidth * link_efficiency`` bytes per second after ``link_latency_s``. The usable
    memory for weights plus KV is ``memory_bytes * mem_fraction``.
    """

    name: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: float
    link_bandwidth: float
    mem_fraction: float = 0.9
    link_efficiency: float = 1.0
    link_latency_s: float = 0.0
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    step_overhead_s: float = 0.0
    description: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "mem_bandwidth", "memory_bytes", "link_bandwidth"):
            if not getattr(self, name) > 0:
                raise ProfileError(f"hardware profile {self.name!r}: {name} must be > 0")
        for name in ("mem_fraction", "link_efficiency", "compute_efficiency", "memory_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ProfileError(f"hardware profile {self.name!r}: {name} must be in (0, 1]")
        if self.link_latency_s < 0 or self.step_overhead_s < 0:
            raise ProfileError(f"hardware profile {self.name!r}: latencies must be >= 0")

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def effective_mem_bandwidth(self) -> float:
        return self.mem_bandwidth * self.memory_efficiency

    @property
    def effective_link_bandwidth(self) -> float:
        return self.link_bandwidth * self.link_efficiency

    def to_json(self) -> dict[str, Any]:
        return {"kind": "hardware", **asdict(self)}


@dataclass(frozen=True)
class ModelProfile:
    """A decoder-only transformer, described by what the roofline needs."""

    name: str
    params: float
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    description: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in {"name", "description"}:
                continue
            if not getattr(self, f.name) > 0:
                raise ProfileError(f"model profile {self.name!r}: {f.name} must be > 0")

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token (Qwen2.5-32B bf16: 64*8*128*2*2 = 256 KiB)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @cached_property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @cached_property
    def attention_flops_per_pair(self) -> int:
        """FLOPs for one (query token, key token) pair over all layers: QK^T plus PV."""
        return 4 * self.n_layers * self.n_heads * self.head_dim

    def to_json(self) -> dict[str, Any]:
        return {"kind": "model", **asdict(self)}


def _read(name_or_path: str | Path, kind: str) -> dict[str, Any]:
    path = Path(name_or_path)
    if not path.suffix == ".json":
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        names = ", ".join(available_profiles()[kind])
        raise ProfileError(f"no {kind} profile {str(name_or_path)!r}; bundled: {names}, or a path to a .json file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise ProfileError(f"{path}: expected an object with \"kind\": \"{kind}\"")
    return data


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known - {"kind"}
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {sorted(unknown)}")
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    return _build(HardwareProfile, _read(name_or_path, "hardware"), str(name_or_path))


def load_model(name_or_path: str | Path) -> ModelProfile:
    return _build(ModelProfile, _read(name_or_path, "model"), str(name_or_path))


def available_profiles() -> dict[str, list[str]]:
    """Bundled profile names by kind."""
    out: dict[str, list[str]] = {"hardware": [], "model": []}
    for path in sorted(PROFILE_DIR.glob("*.json")):
        kind = json.loads(path.read_text()).get("kind")
        if kind in out:
            out[kind].append(path.stem)
    return out


def device_kv_tokens(hardware: HardwareProfile, model: ModelProfile) -> int:
    """KV tokens that fit beside the weights in the usable device memory."""
    free = hardware.memory_bytes * hardware.mem_fraction - model.weight_bytes
    if free <= 0:
        raise ProfileError(
            f"{model.name} weights ({model.weight_bytes / 1e9:.1f} GB) do not fit in "
            f"{hardware.name} usable memory ({hardware.memory_bytes * hardware.mem_fraction / 1e9:.1f} GB)"
        )
    return int(free // model.kv_bytes_per_token)
