"""The eviction spec's adapter over SGLang 0.5.23's real ``UnifiedRadixCache`` (Python tree core,
``--radix-eviction-policy kvflow``, HiCache write-through for the host tier) with the kvflow plugin
loaded through its entry point (``.venv-sglang``).

Requests take the HTTP side's path (the tokenizer-manager hook validates the hint and flattens it),
then the scheduler's (the queue hook, then ``tests/sglang/sglang_rig.py``'s ``serve``: match, lock,
``alloc_token_slots``, checkpoint, ``release_kv_cache``); steps updates are ``KVFlowStepsReq``
messages through the request dispatcher the plugin extends. SGLang's ``Scheduler`` cannot be built
here (it loads a model worker on a GPU), so its hooked methods cannot run whole: the plugin's hooks
on them are called as SGLang calls them, found in SGLang's ``HookRegistry``, with a stand-in for
the scheduler carrying the two fields they read (the pool size and the dispatcher).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from eviction_spec import Setup
from kvflow_orch.protocol import KVFlowHint, StepsUpdate, steps_as_json

from sglang_rig import CacheRig, load_plugin

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"


def _plugin_hook(target: str) -> Callable[..., Any]:
    """The kvflow hook registered on ``target``. NOTE: reads ``HookRegistry._hooks`` (SGLang's own
    registry, private in 0.5.23): it is what ``apply_hooks`` wraps the method with, and the only
    way to reach a hook whose method cannot run here."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    hooks = [hook for _, hook, _ in HookRegistry._hooks.get(target, ()) if hook.__module__.startswith("backends.")]
    assert len(hooks) == 1, f"the kvflow plugin registers one hook on {target}, found {hooks}"
    return hooks[0]


def _fresh_plugin_state() -> None:
    """A new server process starts with empty plugin state; here sessions share one process.
    NOTE: the plugin's test entry point (``state.reset_state``), isolated here."""
    from backends.sglang_kvflow.state import reset_state

    reset_state()


class SGLangSession:
    def __init__(self, setup: Setup) -> None:
        from sglang.utils import TypeBasedDispatcher

        _fresh_plugin_state()
        options = {} if setup.namespace_cap_tokens is None else {"namespace_cap_tokens": setup.namespace_cap_tokens}
        hicache = setup.host_tokens > 0
        self.rig = CacheRig(size=setup.device_tokens, policy="kvflow", hicache=hicache, policy_config=options,
                            hicache_ratio=setup.host_tokens / setup.device_tokens if hicache else 2.0)
        # The scheduler's fields the dispatcher hook reads: its pool size and its dispatcher.
        self.scheduler = SimpleNamespace(max_total_num_tokens=setup.device_tokens,
                                         _request_dispatcher=TypeBasedDispatcher([]))
        _plugin_hook(f"{_SCHEDULER}.init_request_dispatcher")(None, self.scheduler)
        self.queued = _plugin_hook(f"{_SCHEDULER}._add_request_to_queue")

    def request(self, tokens: Sequence[int], hint: KVFlowHint | None, fixed_tokens: int | None) -> None:
        custom = None
        if hint is not None:
            custom = {"kvflow": hint.model_dump(mode="json")}
            if fixed_tokens is not None:
                custom["kvflow_fixed_tokens"] = fixed_tokens
        req = self.rig.make_req(list(tokens), custom)
        self.queued(self.scheduler, req)
        self.rig.serve(req)

    def apply_steps(self, update: StepsUpdate) -> None:
        from backends.sglang_kvflow.hints_bridge import KVFlowStepsReq

        self.scheduler._request_dispatcher(KVFlowStepsReq(
            workflow_id=update.workflow_id, namespace=update.namespace, steps=steps_as_json(update.steps),
            done=update.done, sent_at=time.time()))

    def evict_host(self, tokens: int) -> None:
        self.rig.cache.evict_host(tokens)

    def held(self, tokens: Sequence[int], *, any_tier: bool) -> int:
        from array import array

        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        match = self.rig.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        return match.device_prefix_len + (match.host_hit_length if any_tier else 0)

    def close(self) -> None:
        self.rig.cache.sanity_check()
        self.rig.close()


class SGLangHost:
    name = "sglang"
    lacks: dict[str, str] = {}
    diverges: dict[str, str] = {}

    def __init__(self) -> None:
        load_plugin()

    def open(self, setup: Setup) -> SGLangSession:
        return SGLangSession(setup)
