"""A Llama-family decoder (RMSNorm, rotate-half RoPE, GQA, SwiGLU) that reads and writes its KV
cache through slot indices into pool tensors it does not own.

One forward call serves a *ragged batch*: ``B`` sequences, each contributing ``q_len[b]`` new tokens
(a prefill chunk, or 1 token in decode) whose keys/values are written to ``write_slots`` and whose
attention context is the ordered slot list ``ctx_slots[b]`` (cached prefix + the new tokens).
Keys are stored after RoPE, so a cached prefix is reusable by any request that shares it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ModelConfig", "LlamaModel", "RaggedBatch", "KVStore", "build_batch"]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False
    """Qwen2 has biases on q/k/v."""
    max_position: int = 8192
    architecture: str = "llama"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")


class KVStore(Protocol):
    """Per-layer key/value tensors shaped ``[slots, kv_heads, head_dim]``."""

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


class RaggedBatch(NamedTuple):
    """Index tensors for one forward call (built by :func:`build_batch`)."""

    input_ids: torch.Tensor  # [N] new tokens of all sequences, concatenated
    positions: torch.Tensor  # [N]
    write_slots: torch.Tensor  # [N] where each new token's K/V goes
    ctx_slots: torch.Tensor  # [B, Lmax] context slots per sequence (padding repeats a valid slot)
    mask: torch.Tensor  # [B, 1, Tmax, Lmax] bool, True = may attend
    scatter_index: torch.Tensor  # [N] flat position of each new token in the padded [B*Tmax] query grid
    last_index: torch.Tensor  # [B] index into N of each sequence's last new token
    batch: int
    max_q: int
    decode: bool = False  # one generated token per sequence (not a prompt's last token)


def build_batch(
    new_tokens: Sequence[Sequence[int]], contexts: Sequence[Sequence[int]], device: torch.device | str,
    decode: bool = False,
) -> RaggedBatch:
    """``contexts[b]`` lists every slot sequence ``b`` attends to, ending with the slots of ``new_tokens[b]``;
    ``decode``: every sequence adds one generated token (attention takes :func:`decode_attention`)."""
    ids, pos, write, scatter, last = [], [], [], [], []
    lmax = max(len(c) for c in contexts)
    tmax = max(len(t) for t in new_tokens)
    mask = torch.zeros(len(contexts), 1, tmax, lmax, dtype=torch.bool)
    ctx = torch.zeros(len(contexts), lmax, dtype=torch.long)
    for b, (toks, slots) in enumerate(zip(new_tokens, contexts, strict=True)):
        t, length = len(toks), len(slots)
        if t == 0 or t > length:
            raise ValueError(f"sequence {b}: {t} new tokens with a context of {length} slots")
        start = length - t
        ids.extend(toks)
        pos.extend(range(start, length))
        write.extend(slots[start:])
        scatter.extend(b * tmax + i for i in range(t))
        last.append(len(ids) - 1)
        ctx[b, :length] = torch.tensor(slots, dtype=torch.long)
        ctx[b, length:] = slots[0]
        causal = torch.ones(t, length, dtype=torch.bool).tril(diagonal=start)
        mask[b, 0, :t, :length] = causal
        mask[b, 0, t:, 0] = True  # padded query rows see one key so softmax stays finite

    def as_long(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long, device=device)

    return RaggedBatch(
        as_long(ids), as_long(pos), as_long(write), ctx.to(device), mask.to(device),
        as_long(scatter), as_long(last), len(contexts), tmax, decode and tmax == 1,
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [N, heads, head_dim]; rotate-half (HF/NeoX) layout
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query per sequence: ``q`` ``[B, heads, hd]``, ``keys``/``values`` ``[B, L, kv_heads * hd]`` (rows as
    gathered from the pool, no copy), ``mask`` ``[B, 1, 1, L]`` -> ``[B, heads * hd]``.

    The fused attention kernels are built for many queries; on the CPU they cost several times this for a
    single one, and so does any layout that needs K/V transposed per KV head (the copy dominated long
    contexts). Instead every query head is scored against all KV heads' columns in one matmul, with
    ``q`` spread block-diagonally (zeros outside its own KV head's block), and the output keeps each
    head's own block: a few times the (tiny) multiply work, no K/V copy. Softmax in float32. Used for
    generated tokens only: a prompt's tokens always take the fused kernel (see ``Attention``)."""
    b, heads, hd = q.shape
    kv_heads = keys.shape[-1] // hd
    group = heads // kv_heads
    own_block = torch.eye(kv_heads, dtype=q.dtype, device=q.device)
    # spread[b, k*hd + d, m*group + j] = q[b, k*group + j, d] when k == m, else 0
    spread = torch.einsum("bkjd,km->bkdmj", q.view(b, kv_heads, group, hd), own_block).reshape(b, kv_heads * hd, heads)
    scores = torch.bmm(keys, spread).float() * hd ** -0.5  # [B, L, heads]
    scores.masked_fill_(~mask.view(b, -1, 1), float("-inf"))
    probs = scores.softmax(1).to(values.dtype)
    out = torch.bmm(probs.transpose(1, 2), values).view(b, kv_heads, group, kv_heads, hd)  # every head x every block
    return torch.diagonal(out, dim1=1, dim2=3).permute(0, 3, 1, 2).reshape(b, heads * hd)


PREFILL_QUERY_BLOCK = 128


def causal_blocks_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
) -> torch.Tensor:
    """A prompt chunk's attention (one sequence: ``q`` ``[1, heads, T, hd]``, ``keys``/``values``
    ``[1, kv_heads, L, hd]`` whose last ``T`` rows are the chunk's own, ``mask`` ``[1, 1, T, L]`` causal)
    in blocks of ``PREFILL_QUERY_BLOCK`` queries, each against only the keys it can see: the CPU's fused
    kernel does not skip the masked upper triangle, so a full chunk did about twice the work (this is
    about 30% faster on a fresh 512-1k-token chunk). Blocks start at the chunk's start, so a chunk is
    always split the same way whatever prefix it follows."""
    chunk, prefix = q.shape[2], keys.shape[2] - q.shape[2]
    parts = []
    for start in range(0, chunk, PREFILL_QUERY_BLOCK):
        end = min(start + PREFILL_QUERY_BLOCK, chunk)
        seen = prefix + end
        parts.append(F.scaled_dot_product_attention(q[:, :, start:end], keys[:, :, :seen], values[:, :, :seen],
                                                    attn_mask=mask[:, :, start:end, :seen], enable_gqa=True))
    return torch.cat(parts, dim=2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.q_proj = nn.Linear(cfg.hidden_size, nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, rope: Rotary, rb: RaggedBatch, kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        cfg, n = self.cfg, x.shape[0]
        q = rope(self.q_proj(x).view(n, cfg.num_heads, cfg.head_dim), rb.positions)
        k = rope(self.k_proj(x).view(n, cfg.num_kv_heads, cfg.head_dim), rb.positions)
        v = self.v_proj(x).view(n, cfg.num_kv_heads, cfg.head_dim)
        k_pool, v_pool = kv
        k_pool[rb.write_slots] = k.to(k_pool.dtype)
        v_pool[rb.write_slots] = v.to(v_pool.dtype)
        # index_select on the flat slot list gathers the same rows as ``pool[ctx_slots]`` several
        # times faster on the CPU (advanced indexing was over half of a long-context decode step).
        flat = rb.ctx_slots.reshape(-1)
        rows = (rb.batch, rb.ctx_slots.shape[1], cfg.num_kv_heads * cfg.head_dim)
        keys = k_pool.index_select(0, flat).view(rows).to(q.dtype)  # [B, L, kvh * hd]
        values = v_pool.index_select(0, flat).view(rows).to(q.dtype)
        if rb.decode:
            return self.o_proj(decode_attention(q, keys, values, rb.mask))
        per_head = (rb.batch, rb.ctx_slots.shape[1], cfg.num_kv_heads, cfg.head_dim)
        keys, values = keys.view(per_head).transpose(1, 2), values.view(per_head).transpose(1, 2)  # [B, kvh, L, hd]
        if rb.max_q == 1:
            # A prompt's last token alone (its prefix cached) goes through the same kernel as a
            # prefill chunk, so the first generated token is the same bits either way, even in bf16.
            queries = q.unsqueeze(2)
        else:
            grid = q.new_zeros(rb.batch * rb.max_q, cfg.num_heads, cfg.head_dim)
            grid[rb.scatter_index] = q
            queries = grid.view(rb.batch, rb.max_q, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        if rb.batch == 1 and rb.max_q > PREFILL_QUERY_BLOCK:
            out = causal_blocks_attention(queries, keys, values, rb.mask)
        else:
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=rb.mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(rb.batch * rb.max_q, cfg.num_heads * cfg.head_dim)
        if rb.max_q != 1:
            out = out[rb.scatter_index]
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, rb, kv):
        x = x + self.self_attn(self.input_layernorm(x), rope, rb, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Parameter names follow Hugging Face's ``LlamaForCausalLM`` minus the ``model.`` prefix."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position)

    @torch.inference_mode()
    def forward(self, rb: RaggedBatch, kv: KVStore) -> torch.Tensor:
        """Write the new tokens' K/V into ``kv`` and return the logits of each sequence's last token ``[B, vocab]``."""
        x = self.embed_tokens(rb.input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.rope, rb, kv.layer(i))
        return self.lm_head(self.norm(x[rb.last_index])).float()
