"""Shims that let SGLang 0.5.23's cache, scheduler and HTTP layers run on CPU torch: for the CPU
tests and benchmarks only, never installed by the plugin itself (GPU builds need none of them).

Nothing here is faked behaviour of kvflow: each shim stands in for a CUDA-only piece of the
environment that cannot exist on this machine.

* torchvision: the only wheel on the index is a CUDA build whose import registers fake kernels for
  ``torchvision::nms``; on CPU torch that operator schema is missing, so we define the schemas.
* HiCache host pools pin memory with ``cudaHostRegister`` and copy with a CUDA/XPU-only helper;
  on CPU we skip the pinning and copy rows with plain indexing (synchronous, so no overlap).
"""

from __future__ import annotations

__all__ = ["install_import_shims", "install_hicache_shims"]

_tv_lib = None  # keep the Library object alive: dropping it unregisters the schemas


def install_import_shims() -> None:
    """Make ``import sglang`` work on CPU torch (call before importing sglang)."""
    global _tv_lib
    import torch

    try:
        _ = torch.ops.torchvision.nms  # the lookup raises unless the real ops are present
        return
    except (AttributeError, RuntimeError):
        pass
    if _tv_lib is None:
        _tv_lib = torch.library.Library("torchvision", "DEF")
        _tv_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _tv_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size=1, **_):
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices] = src[src_indices]


def install_hicache_shims() -> None:
    """Let ``UnifiedRadixCache.init_hicache`` build host pools and copy KV on CPU torch."""
    import sglang.srt.mem_cache.pool_host.common as pool_host_common
    import sglang.srt.mem_cache.pool_host.mha as pool_host_mha

    pool_host_common._cuda_host_register = lambda *a, **k: None
    pool_host_mha.transfer_kv_direct = _transfer_kv_direct
