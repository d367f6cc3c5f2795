"""The eviction spec's adapter over vLLM's CPU build (``.venv-vllm``): the real ``KVFlowScheduler``
(vLLM's ``Scheduler`` subclass the plugin ships, on vLLM's ``KVCacheManager`` and ``BlockPool``),
driven as ``EngineCore`` drives it, without a model or a server.

A request goes ``add_request`` → ``schedule`` → ``update_from_output`` (one sampled token, so it
finishes and frees its blocks); its hint takes the API server's path first (the routes plugin's
``rewrite_body`` moves ``custom_params.kvflow`` to ``kv_transfer_params``). Steps updates are the
``kvflow_call`` utility the API server calls. What stands in for the parts that are not run: the
model's output (a ``ModelRunnerOutput`` with one token per request; eviction never reads it) and
the model's ``config.json`` (a tiny Llama shape vLLM's config parser accepts; no weights are
loaded). vLLM evicts whole blocks: the spec's :data:`BLOCK` is the block size here.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from eviction_spec import BLOCK, HOST_TIER, Setup
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "vocab_size": 4096, "max_position_embeddings": 1024, "torch_dtype": "float32", "rms_norm_eps": 1e-5}
_MAX_LEN = 1024


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


class VLLMSession:
    def __init__(self, setup: Setup, model_dir: Path) -> None:
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        from backends.vllm_kvflow import CONFIG_ENV
        from backends.vllm_kvflow.scheduler import KVFlowScheduler

        blocks = setup.device_tokens // BLOCK + 1  # block 0 is vLLM's null block
        config = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=_MAX_LEN,
                                     dtype="float32"),
            scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=_MAX_LEN, max_model_len=_MAX_LEN,
                                             is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True))
        config.cache_config.num_gpu_blocks = blocks  # what EngineCore sets once it has sized the pool
        kv_cache = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["model.layers.0.self_attn.attn"],
            FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32))])
        options = {} if setup.namespace_cap_tokens is None else {"namespace_cap_tokens": setup.namespace_cap_tokens}
        with _env(CONFIG_ENV, json.dumps(options)):  # what the launcher hands the engine core
            self.scheduler = KVFlowScheduler(vllm_config=config, kv_cache_config=kv_cache,
                                             structured_output_manager=StructuredOutputManager(config),
                                             block_size=BLOCK)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.ids = (f"r{i}" for i in itertools.count())

    def _request(self, tokens: Sequence[int], kv_transfer_params: dict | None, max_tokens: int = 1) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
        params = SamplingParams(max_tokens=max_tokens, extra_args=extra)
        return Request(next(self.ids), list(tokens), params, None, block_hasher=self.hasher)

    def _hinted(self, tokens: Sequence[int], hint: KVFlowHint | None, fixed_tokens: int | None,
                max_tokens: int = 1) -> Any:
        """A request with ``hint`` where the API server puts it (``None``: a plain request)."""
        from backends.vllm_kvflow.routes import rewrite_body
        from backends.vllm_kvflow.state import PREFIX_TOKENS_KEY

        params = None
        if hint is not None:
            body: dict[str, Any] = {"prompt": list(tokens), "custom_params": {"kvflow": hint.model_dump(mode="json")}}
            if fixed_tokens is not None:
                body["kv_transfer_params"] = {PREFIX_TOKENS_KEY: fixed_tokens}
            params = rewrite_body(body, "/v1/completions", None)["kv_transfer_params"]
        return self._request(tokens, params, max_tokens)

    def _step(self) -> Any:
        """One engine step: every scheduled request whose prompt is done samples one token."""
        from vllm.v1.outputs import ModelRunnerOutput

        out = self.scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = [[0] if (r := self.scheduler.requests[i]).num_computed_tokens + out.num_scheduled_tokens[i]
                   >= r.num_prompt_tokens else [] for i in ids]
        self.scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
            logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        return out

    def request(self, tokens: Sequence[int], hint: KVFlowHint | None, fixed_tokens: int | None) -> None:
        req = self._hinted(tokens, hint, fixed_tokens)
        self.scheduler.add_request(req)
        out = self._step()
        assert req.request_id in out.num_scheduled_tokens, "vLLM did not schedule the request (pool too small?)"
        assert req.request_id not in self.scheduler.requests, "the one-token request did not finish"

    def start(self, tokens: Sequence[int], hint: KVFlowHint | None, fixed_tokens: int | None) -> tuple[Any, int]:
        """Admit a request and run engine steps until its prompt is computed (other running
        requests decode meanwhile); it keeps its blocks until :meth:`finish`. Returns it with the
        prompt tokens it hit in the cache."""
        req = self._hinted(tokens, hint, fixed_tokens, max_tokens=_MAX_LEN)
        before = self.scheduler.kvflow.stats.device_hit_tokens
        self.scheduler.add_request(req)
        while req.num_computed_tokens < req.num_prompt_tokens:
            assert self._step().num_scheduled_tokens, "vLLM scheduled nothing (pool too small?)"
        return req, self.scheduler.kvflow.stats.device_hit_tokens - before

    def finish(self, req: Any) -> None:
        """End a started request (its reply is complete): its blocks go to the free queue."""
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_STOPPED)

    def apply_steps(self, update: StepsUpdate) -> None:
        assert self.scheduler.kvflow_call("steps", update.model_dump(mode="json")) == {"ok": True}

    def evict_host(self, tokens: int) -> None:
        raise AssertionError("vLLM has no host tier on CPU")

    def held(self, tokens: Sequence[int], *, any_tier: bool) -> int:
        # One more token than asked: vLLM never reports a whole prompt as a hit (it recomputes
        # the last token), and get_computed_blocks reads the cache without touching it.
        _, hit, _ = self.scheduler.kv_cache_manager.get_computed_blocks(self._request([*tokens, 0], None))
        return hit

    def close(self) -> None:
        assert not self.scheduler.requests


class VLLMHost:
    name = "vllm"
    lacks = {HOST_TIER: "vLLM's host tier (OffloadingConnector) refuses CPU in v1/kv_offload/cpu/spec.py"}
    diverges: dict[str, str] = {}

    def __init__(self, folder: Path) -> None:
        self.model_dir = folder / "tiny-llama-config"
        self.model_dir.mkdir(parents=True, exist_ok=True)
        (self.model_dir / "config.json").write_text(json.dumps(_CONFIG))

    def open(self, setup: Setup) -> VLLMSession:
        return VLLMSession(setup, self.model_dir)
