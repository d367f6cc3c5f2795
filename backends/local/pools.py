"""KV tensors of one memory tier, indexed by the slots the cache brain hands out.

Layout ``[layers, slots, kv_heads, head_dim]`` for keys and values: one slot holds one token's K/V in
every layer, so a slot index means the same thing in both tiers and a copy between tiers is a
row gather/scatter. On CUDA the device pool lives on the GPU and the host pool in pinned CPU memory.
"""

from __future__ import annotations

import threading
from typing import Sequence

import torch

from backends.local.model.llama import ModelConfig

__all__ = ["KVPool", "copy_slots"]


class KVPool:
    """Implements ``backends.local.model.llama.KVStore``."""

    def __init__(self, cfg: ModelConfig, tokens: int, *, device: torch.device | str, dtype: torch.dtype,
                 pin: bool = False, lazy: bool = False) -> None:
        shape = (cfg.num_layers, tokens, cfg.num_kv_heads, cfg.head_dim)
        self.tokens = tokens
        self.device = torch.device(device)
        self.pinned = pin
        # Only rows the brain handed out are ever read, so the host tier may stay uncommitted memory
        # until used; the device pool is zeroed (small, and cheap insurance against stray reads).
        make = torch.empty if lazy else torch.zeros
        try:
            self.k = make(shape, dtype=dtype, device=device, pin_memory=pin)
            self.v = make(shape, dtype=dtype, device=device, pin_memory=pin)
        except RuntimeError:  # torch.OutOfMemoryError included
            need = 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            raise MemoryError(
                f"cannot allocate a KV pool of {tokens} tokens on {self.device}: {need / 2**30:.1f} GiB is more "
                f"than is free; use fewer tokens (--device-tokens / --host-tokens)") from None

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


_staging = threading.local()


def gather_rows(tensor: torch.Tensor, index: torch.Tensor, slot: str, *, pin: bool) -> torch.Tensor:
    """``tensor.index_select(1, index)`` written into a buffer kept per thread and ``slot`` (grown on
    demand, pinned with ``pin``): a host->device copy then starts from pinned memory without
    allocating and pinning fresh memory for every load. The result stays valid until the same thread
    gathers into the same ``slot`` again, so a caller copying asynchronously must synchronise first."""
    shape = (tensor.shape[0], len(index)) + tuple(tensor.shape[2:])
    need = torch.Size(shape).numel()
    buf = getattr(_staging, slot, None)
    if buf is None or buf.dtype != tensor.dtype or buf.numel() < need or buf.is_pinned() != pin:
        buf = torch.empty(max(need, 1 << 20), dtype=tensor.dtype, pin_memory=pin)
        setattr(_staging, slot, buf)
    out = buf[:need].view(shape)
    torch.index_select(tensor, 1, index, out=out)
    return out


def copy_slots(src: KVPool, src_slots: Sequence[int], dst: KVPool, dst_slots: Sequence[int], *,
               non_blocking: bool = False) -> None:
    """Copy the K/V rows ``src_slots[i]`` of ``src`` into rows ``dst_slots[i]`` of ``dst`` (all layers).

    Host->device: rows are gathered into per-thread pinned staging buffers (one for K, one for V) and
    copied from there; with ``non_blocking`` the caller must synchronise the current stream before
    it copies again on the same thread (the prefetch worker does after every task)."""
    if len(src_slots) != len(dst_slots):
        raise ValueError(f"copy of {len(src_slots)} slots into {len(dst_slots)}")
    if not src_slots:
        return
    s = torch.tensor(src_slots, dtype=torch.long, device=src.device)
    d = torch.tensor(dst_slots, dtype=torch.long, device=dst.device)
    upload = src.device.type == "cpu" and dst.device.type == "cuda"
    for name, a, b in (("k", src.k, dst.k), ("v", src.v, dst.v)):
        if upload:
            rows = gather_rows(a, s, name, pin=True).to(dst.device, non_blocking=non_blocking)
        else:
            rows = a.index_select(1, s)
            if rows.device != dst.device:
                rows = rows.to(dst.device)
        b.index_copy_(1, d, rows)
