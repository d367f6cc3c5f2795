"""kvflow as a plugin of SGLang 0.5.23 (no fork): workflow-aware eviction, prefetch, status-aware
admission and the kvflow hint API inside SGLang's own scheduler.

SGLang runs :func:`register` in every process it starts (the ``sglang.srt.plugins`` entry point in
pyproject.toml), then applies the hooks. Set ``KVFLOW_SGLANG_PLUGIN=off`` to load stock behaviour
with the package installed (``kvflow serve --engine sglang --policy lru`` does).
"""

from __future__ import annotations

import logging
import multiprocessing
import os

__all__ = ["register", "POLICY_NAME", "TREE_CORE_ENV", "DISABLE_ENV"]

logger = logging.getLogger(__name__)

POLICY_NAME = "kvflow"
TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
DISABLE_ENV = "KVFLOW_SGLANG_PLUGIN"

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_CACHE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_HTTP = "sglang.srt.entrypoints.http_server"
_CHAT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"

_registered = False


def _install_routes_before_launch(*_: object, **__: object) -> None:
    from sglang.srt.entrypoints import http_server

    from .routes import install_routes

    install_routes(http_server.app)


def register() -> None:
    """Register the ``kvflow`` policy and the hooks (idempotent). SGLang applies the hooks after
    every plugin has registered (``load_plugins``); direct callers call ``HookRegistry.apply_hooks``.
    """
    global _registered
    if _registered:
        return
    if os.environ.get(DISABLE_ENV, "").lower() in {"0", "off", "false", "no"}:
        logger.info("kvflow plugin disabled by %s; SGLang runs stock", DISABLE_ENV)
        return
    _registered = True

    from sglang.srt.mem_cache import utils as mem_cache_utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import add_radix_eviction_policy_choices

    from .admission import returns_first, wrap_adder_class
    from .hints_bridge import install_scheduler_handlers, install_stats_communicator, register_message_types
    from .hints_bridge import mark_chat_boundary, validate_generate_request
    from .hicache_prefetch import after_hicache_events
    from .strategy import KVFlowStrategy
    from .tags import on_request_queued, split_keeps_tags, split_stamp_before, tag_after_checkpoint

    # The only lookup SGLang has for policies; add_*_choices is its public hook for CLI choices.
    mem_cache_utils._EVICTION_POLICY_FACTORIES[POLICY_NAME] = KVFlowStrategy
    add_radix_eviction_policy_choices([POLICY_NAME])
    # The Rust tree core accepts only built-in policy names and exposes no nodes to tag.
    previous = os.environ.get(TREE_CORE_ENV)
    os.environ[TREE_CORE_ENV] = "python"
    logger.info("kvflow plugin: forcing the Python radix tree core (%s=python, was %s): the kvflow "
                "policy needs per-node tags", TREE_CORE_ENV, previous or "default rust")
    register_message_types()

    reg = HookRegistry.register
    reg(f"{_SCHEDULER}._add_request_to_queue", on_request_queued, HookType.BEFORE)
    reg(f"{_SCHEDULER}.init_request_dispatcher", install_scheduler_handlers, HookType.AFTER)
    reg(f"{_SCHEDULER}._process_hicache_events", after_hicache_events, HookType.AFTER)
    reg(f"{_SCHEDULER}.get_prefill_adder_class", wrap_adder_class, HookType.AFTER)
    reg(f"{_POLICY}.calc_priority", returns_first, HookType.AFTER)
    reg(f"{_CACHE}.checkpoint_into_tree", tag_after_checkpoint, HookType.AFTER)
    reg(f"{_CORE}._split_node", split_stamp_before, HookType.BEFORE)
    reg(f"{_CORE}._split_node", split_keeps_tags, HookType.AFTER)
    if multiprocessing.current_process().name == "MainProcess":
        # HTTP side: only the main process serves the app and runs the tokenizer manager.
        reg(f"{_TOKENIZER}.generate_request", validate_generate_request, HookType.BEFORE)
        reg(f"{_CHAT}._convert_to_internal_request", mark_chat_boundary, HookType.AFTER)
        reg(f"{_TOKENIZER}.init_request_dispatcher", install_stats_communicator, HookType.AFTER)
        reg(f"{_HTTP}.launch_server", _install_routes_before_launch, HookType.BEFORE)
