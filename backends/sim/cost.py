"""Roofline cost model: how long a forward pass and a KV copy take on a hardware profile.

A forward pass over a batch is bounded by compute (matmul FLOPs of every new token plus attention
FLOPs of every (query, key) pair) and by memory traffic (the weights once, plus the KV cache read
and written); its time is the larger of the two at the profile's effective rates, plus a fixed
per-iteration overhead. Every formula is linear in its inputs so tests can check it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from .profiles import HardwareProfile, ModelProfile

__all__ = ["Work", "CostModel"]


class Work(NamedTuple):
    """One request's share of a forward pass: ``new`` tokens computed after ``context`` cached ones.

    A decode step is ``Work(1, context)``; a prefill that hit ``c`` cached tokens of an ``n``-token
    prompt is ``Work(n - c, c)``.
    """

    new: int
    context: int


@dataclass(frozen=True)
class CostModel:
    hardware: HardwareProfile
    model: ModelProfile

    # --------------------------------------------------------------- compute stream
    def flops(self, batch: Iterable[Work]) -> float:
        m = self.model
        total = 0.0
        for new, context in batch:
            # Causal attention: the i-th new token attends to context + i keys (i = 1..new).
            pairs = new * context + new * (new + 1) / 2
            total += 2.0 * m.params * new + m.attention_flops_per_pair * pairs
        return total

    def bytes_moved(self, batch: Iterable[Work]) -> float:
        m = self.model
        kv = sum(new + context for new, context in batch) * m.kv_bytes_per_token
        return m.weight_bytes + kv

    def forward_time(self, batch: Iterable[Work]) -> float:
        """Seconds for one iteration of the compute stream over ``batch`` (0 for an empty batch)."""
        batch = list(batch)
        if not batch:
            return 0.0
        hw = self.hardware
        compute = self.flops(batch) / hw.effective_flops
        memory = self.bytes_moved(batch) / hw.effective_mem_bandwidth
        return max(compute, memory) + hw.step_overhead_s

    def prefill_time(self, new: int, context: int = 0) -> float:
        return self.forward_time([Work(new, context)])

    def decode_time(self, contexts: Iterable[int]) -> float:
        """One decode step for a batch of requests with the given context lengths."""
        return self.forward_time([Work(1, c) for c in contexts])

    # --------------------------------------------------------------- host link
    def transfer_time(self, tokens: int) -> float:
        """Seconds to copy ``tokens`` tokens of KV over one direction of the host link."""
        if tokens <= 0:
            return 0.0
        hw = self.hardware
        return hw.link_latency_s + tokens * self.model.kv_bytes_per_token / hw.effective_link_bandwidth

    def layer_time(self, forward_time: float) -> float:
        """The share of a forward pass spent in one layer (loads overlap compute layer by layer)."""
        return forward_time / self.model.n_layers
