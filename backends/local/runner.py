"""Model runner: turns token/slot lists into forward passes over the device KV pool.

* ``prefill`` extends a sequence whose first ``len(prefix_slots)`` tokens are already in the pool
  (a cache hit gathered by slot) by the new tokens, in chunks of at most ``chunk_tokens``.
* ``decode`` advances many sequences by one token in a single batched forward.
Time spent inside the model is accumulated in ``forward_s`` (the scheduler-overhead benchmark uses it);
setting ``busy`` to a list records every forward's ``(start, end)`` ``time.perf_counter`` interval
(the GPU check measures how much prefetch copying these intervals hide). On CUDA only the compute
stream is synchronised, so a copy running on the prefetch stream never delays a forward's end.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from backends.local.model.llama import LlamaModel, build_batch
from backends.local.pools import KVPool

__all__ = ["ModelRunner"]


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: KVPool, chunk_tokens: int) -> None:
        if chunk_tokens <= 0:
            raise ValueError("chunk_tokens must be > 0")
        self.model = model
        self.pool = pool
        self.chunk_tokens = chunk_tokens
        self.device = pool.device
        self.forward_s = 0.0
        self.busy: list[tuple[float, float]] | None = None

    def _forward(self, new_tokens: Sequence[Sequence[int]], contexts: Sequence[Sequence[int]],
                 decode: bool = False) -> torch.Tensor:
        batch = build_batch(new_tokens, contexts, self.device, decode)  # index building counts as scheduling work
        start = time.perf_counter()
        logits = self.model(batch, self.pool)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        end = time.perf_counter()
        self.forward_s += end - start
        if self.busy is not None:
            self.busy.append((start, end))
        return logits

    def prefill(self, tokens: Sequence[int], prefix_slots: Sequence[int], new_slots: Sequence[int]) -> torch.Tensor:
        """Compute ``tokens`` (stored into ``new_slots``) after a cached prefix; returns the last
        token's logits ``[vocab]``."""
        if len(tokens) != len(new_slots) or not tokens:
            raise ValueError(f"prefill of {len(tokens)} tokens into {len(new_slots)} slots")
        context = list(prefix_slots)
        logits = None
        for start in range(0, len(tokens), self.chunk_tokens):
            end = min(start + self.chunk_tokens, len(tokens))
            context.extend(new_slots[start:end])
            logits = self._forward([tokens[start:end]], [context])
        assert logits is not None
        return logits[0]

    def decode(self, last_tokens: Sequence[int], contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """One step for each sequence: ``contexts[b]`` ends with the slot for ``last_tokens[b]``;
        returns ``[B, vocab]``."""
        return self._forward([[t] for t in last_tokens], contexts, decode=True)
