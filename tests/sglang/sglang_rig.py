"""SGLang 0.5.23's real cache classes on CPU with the kvflow plugin loaded (see
backends/sglang_kvflow/cpu_shims.py): the rig the plugin tests (tests/sglang) and the eviction
spec's SGLang adapter (tests/conformance) drive. Importing this module imports no sglang."""

from __future__ import annotations

import importlib.util
from array import array
from typing import Any

SGLANG_MISSING = importlib.util.find_spec("sglang") is None
SKIP_REASON = "sglang is not installed here; build .venv-sglang with .ci/setup-sglang"


def load_plugin() -> Any:
    """SGLang with the kvflow plugin loaded through its entry point, hooks applied (idempotent)."""
    from backends.sglang_kvflow.cpu_shims import install_hicache_shims, install_import_shims

    install_import_shims()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    install_hicache_shims()
    import backends.sglang_kvflow as plugin_module

    return plugin_module


class CacheRig:
    """One UnifiedRadixCache on CPU with its pools, and helpers that drive it the way the scheduler
    does (real Req objects, real checkpoint_into_tree)."""

    def __init__(self, *, size: int, policy: str, hicache: bool, policy_config: dict | None = None,
                 hicache_ratio: float = 2.0) -> None:
        import torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        self.server_args = ServerArgs(
            model_path="dummy", page_size=1, hicache_io_backend="direct", hicache_mem_layout="layer_first",
            hicache_write_policy="write_through", radix_eviction_policy=policy, hicache_ratio=hicache_ratio,
        )
        set_global_server_args_for_scheduler(self.server_args)
        self.kv = MHATokenToKVPool(size=size, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=8,
                                   layer_num=2, device="cpu", enable_memory_saver=False)
        self.allocator = TokenToKVPoolAllocator(size=size, dtype=torch.bfloat16, device="cpu",
                                                kvcache=self.kv, need_sort=False)
        self.req_pool = ReqToTokenPool(size=16, max_context_len=512, device="cpu", enable_memory_saver=False)
        params = CacheInitParams(
            disable=False, req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=1, tree_components=(ComponentType.FULL,), eviction_policy=policy,
            eviction_policy_config=policy_config, tree_core_backend="python",
        )
        self.params = params
        self.cache = UnifiedRadixCache(params=params)
        if hicache:
            self.cache.init_hicache(self.server_args, params)
            self.cache.load_back_threshold = 0  # the default 10 refuses our short test prefixes
        self._rid = 0

    def make_req(self, tokens: list[int], custom_params: dict | None = None) -> Any:
        """A scheduler ``Req``; a nested ``custom_params.kvflow`` hint first takes the HTTP side's
        path (validation, then the flat form the scheduler receives)."""
        from sglang.srt.managers.io_struct import GenerateReqInput
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        from backends.sglang_kvflow.hints_bridge import validate_generate_request

        if custom_params is not None and "kvflow" in custom_params:
            obj = GenerateReqInput(input_ids=tokens, sampling_params={"custom_params": custom_params})
            validate_generate_request(None, obj)
            custom_params = obj.sampling_params["custom_params"]
        self._rid += 1
        req = Req(rid=str(self._rid), origin_input_text="", origin_input_ids=array("q", tokens),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=1, custom_params=custom_params))
        req.extra_key = None
        return req

    def run_req(self, req: Any, checkpoints: int = 1) -> Any:
        """Prefill ``req`` from scratch into fresh slots and checkpoint it into the tree (the path
        a finished prefill takes; SGLang checkpoints again when the request ends, hence
        ``checkpoints``), then release it. Returns the KV slots it wrote."""
        tokens = list(req.origin_input_ids)
        self.req_pool.alloc([req])
        slots = self.allocator.alloc(len(tokens))
        assert slots is not None, "test pool too small"
        self.write_kv(slots)
        self.req_pool.write((req.kv.req_pool_idx, slice(0, len(tokens))), slots)
        req.full_untruncated_fill_ids = array("q", tokens)
        req.output_ids = array("q")
        req.extend_end = len(tokens)
        req.kv.kv_committed_len = len(tokens)
        req.kv.cache_protected_len = 0
        req.last_node = self.cache.root_node_handle()
        req.lock = None
        for _ in range(checkpoints):
            self.cache.checkpoint_into_tree(req, up_to=len(tokens))
        self.cache.unlock(req.lock)
        req.lock = None
        self.req_pool.free(req)
        if self.cache.cache_controller is not None:
            self.cache.writing_check(write_back=True)  # CPU copies are synchronous: settle backups
        self.cache.sanity_check()  # SGLang's own tree invariants hold with the plugin's hooks
        return slots

    def serve(self, req: Any) -> None:
        """One request start to end, as SGLang's scheduler runs it: match its cached prefix and
        lock it, allocate the rest (``alloc_token_slots`` first evicts what it must, in the tree's
        order), write its KV, checkpoint it after prefill, finish it and release it
        (``release_kv_cache``: the final checkpoint, unlock, the row freed). Device hits only: a prefix
        found on host alone would need a load-back, which this rig does not drive."""
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.allocation import alloc_token_slots
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        tokens = list(req.origin_input_ids)
        req.output_ids = array("q")
        req.init_next_round_input(self.cache)  # match_prefix: prefix_len, last_node, protected len
        assert req.host_hit_length == 0, "serve() reuses device hits only"
        req.lock = self.cache.lock(req.last_node)  # what the prefill adder takes on admission
        prefix = self.cache.path_device_indices(req.last_node)[:req.prefix_len]
        fresh = alloc_token_slots(self.cache, len(tokens) - req.prefix_len)
        self.write_kv(fresh)
        self.req_pool.alloc([req])
        self.req_pool.write((req.kv.req_pool_idx, slice(0, len(tokens))), torch.cat([prefix, fresh]))
        req.extend_end = len(tokens)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = len(tokens)
        checkpoint_kv_cache(req, self.cache)
        req.finished_reason = FINISH_LENGTH(length=0)
        release_kv_cache(req, self.cache, checkpoint=True)  # also gives the request's row back
        if self.cache.cache_controller is not None:
            self.cache.writing_check(write_back=True)  # CPU copies are synchronous: settle backups
        self.cache.sanity_check()

    def close(self) -> None:
        """Drop the exit hook a HiCache controller registers (its threads are gone by then)."""
        import atexit

        if self.cache.cache_controller is not None:
            atexit.unregister(self.cache.shutdown)

    def write_kv(self, slots: Any) -> None:
        """What a forward pass does: write fresh K/V rows for the computed tokens."""
        import torch

        for layer in range(self.kv.layer_num):
            for buf in (self.kv.k_buffer[layer], self.kv.v_buffer[layer]):
                buf[slots] = torch.randn((len(slots), *buf.shape[1:])).to(buf.dtype)

    def kv_rows(self, slots: Any) -> list[Any]:
        return [buf[slots].clone() for layer in range(self.kv.layer_num)
                for buf in (self.kv.k_buffer[layer], self.kv.v_buffer[layer])]

    def device_tokens(self, tokens: list[int]) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)))).device_prefix_len
