"""The GPU check's pieces that run here: what it imports (the GPU machine has no server, LangGraph
or CLI dependencies), its overlap arithmetic, and the pinned-staging gather of host->device copies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends.local.pools import gather_rows

ROOT = Path(__file__).resolve().parents[2]
ABSENT_THERE = {"fastapi", "starlette", "uvicorn", "langgraph", "langchain_core", "gguf", "httpx", "xgrammar"}


def _load_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_and_its_workloads_import_nothing_the_gpu_machine_lacks():
    probe = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('gpu_check', {str(ROOT / 'benchmarks' / 'gpu_check.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "m.cyclic_workload(3, 16, 4, 2, 2, 2); m.metagpt_workload(8, 4, 2, 2, 1)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mods = set(json.loads(out.stdout.strip().splitlines()[-1]))
    tops = {m.split(".")[0] for m in mods}
    assert not tops & ABSENT_THERE, sorted(tops & ABSENT_THERE)
    heavy_ours = {m for m in mods if m.startswith(("kvflow_orch.cli", "kvflow_orch.harness.", "backends.server",
                                                   "kvflow_orch.langgraph", "kvflow_orch.runtime",
                                                   "kvflow_orch.clients"))}
    heavy_ours -= {"kvflow_orch.harness.calibrate"}  # the roofline profile of a model config (sim profiles only)
    assert not heavy_ours, sorted(heavy_ours)


def test_overlap_counts_copy_time_covered_by_forward_passes():
    overlap = _load_check().overlap
    busy = [(0.0, 1.0), (2.0, 3.0)]
    assert overlap([(0.5, 2.5)], busy) == 1.0  # 0.5 of the first pass, 0.5 of the second
    assert overlap([(1.0, 2.0)], busy) == 0.0  # entirely between passes
    assert overlap([(3.5, 4.0), (0.0, 0.25)], busy) == 0.25
    assert overlap([], busy) == 0.0


def test_gather_rows_matches_index_select_and_reuses_its_buffer():
    pool = torch.randn(3, 50, 2, 4)
    index = torch.tensor([7, 3, 41, 3])
    first = gather_rows(pool, index, "k-test", pin=False)
    assert torch.equal(first, pool.index_select(1, index))
    again = gather_rows(pool, torch.tensor([1, 2]), "k-test", pin=False)
    assert torch.equal(again, pool.index_select(1, torch.tensor([1, 2])))
    assert again.data_ptr() == first.data_ptr()  # same staging buffer, no new allocation
    other = gather_rows(pool.double(), index, "k-test", pin=False)  # another dtype gets a fresh buffer
    assert other.dtype == torch.float64 and torch.equal(other, pool.double().index_select(1, index))


def test_decode_attention_matches_the_fused_kernel_with_padding_and_gqa():
    from backends.local.model.llama import decode_attention

    gen = torch.Generator().manual_seed(0)
    b, heads, kv_heads, hd, length = 3, 6, 2, 8, 11
    q = torch.randn(b, heads, hd, generator=gen)
    keys = torch.randn(b, kv_heads, length, hd, generator=gen)
    values = torch.randn(b, kv_heads, length, hd, generator=gen)
    mask = torch.zeros(b, 1, 1, length, dtype=torch.bool)
    for i, n in enumerate((11, 4, 1)):  # ragged contexts: the rest is padding
        mask[i, ..., :n] = True
    fused = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask,
                                                             enable_gqa=True)
    expected = fused.squeeze(2).reshape(b, heads * hd)

    def as_rows(t):  # the pool's row layout
        return t.transpose(1, 2).reshape(b, length, kv_heads * hd)

    torch.testing.assert_close(decode_attention(q, as_rows(keys), as_rows(values), mask), expected,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk, prefix", [(300, 0), (300, 77), (129, 512)])
def test_causal_blocks_attention_matches_the_full_chunk(chunk: int, prefix: int):
    from backends.local.model.llama import causal_blocks_attention

    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, hd, length = 6, 2, 8, prefix + chunk
    q = torch.randn(1, heads, chunk, hd, generator=gen)
    keys = torch.randn(1, kv_heads, length, hd, generator=gen)
    values = torch.randn(1, kv_heads, length, hd, generator=gen)
    mask = torch.ones(chunk, length, dtype=torch.bool).tril(diagonal=prefix).view(1, 1, chunk, length)
    full = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(causal_blocks_attention(q, keys, values, mask), full, rtol=1e-5, atol=1e-5)
