"""The plugin loads the way SGLang loads plugins: through the ``sglang.srt.plugins`` entry point,
in a fresh process (as in every spawned scheduler), forcing the Python tree core with a log line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert found.get("kvflow") == "backends.sglang_kvflow:register"


def test_load_plugins_in_a_fresh_process_registers_everything():
    script = textwrap.dedent("""
        import logging, os
        logging.basicConfig(level=logging.INFO)
        from backends.sglang_kvflow.cpu_shims import install_import_shims
        install_import_shims()
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.mem_cache.utils import get_eviction_strategy
        from sglang.srt.server_args import RADIX_EVICTION_POLICY_CHOICES
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        print("STRATEGY", type(get_eviction_strategy("kvflow", {"prefetch_lookahead": 2})).__name__)
        print("CHOICE", "kvflow" in RADIX_EVICTION_POLICY_CHOICES)
        print("CORE", os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"])
        print("HOOKED", all(hasattr(f, "__wrapped__") for f in (
            Scheduler._process_hicache_events, Scheduler.get_prefill_adder_class,
            Scheduler.init_request_dispatcher, Scheduler._add_request_to_queue, UnifiedTreeCore._split_node,
            TokenizerManager.generate_request, TokenizerManager.init_request_dispatcher,
            OpenAIServingChat._convert_to_internal_request)))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STRATEGY KVFlowStrategy" in out.stdout and "CHOICE True" in out.stdout
    assert "CORE python" in out.stdout and "HOOKED True" in out.stdout
    assert "forcing the Python radix tree core" in out.stderr


def test_policy_options_are_checked(plugin):
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    with pytest.raises(ValueError, match="lookahed"):
        get_eviction_strategy("kvflow", {"lookahed": 1})


def test_default_core_selection_is_python_and_rust_would_refuse_kvflow(make_rig):
    from dataclasses import replace

    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    rig = make_rig(size=16, policy="kvflow", hicache=False)
    params = replace(rig.params, tree_core_backend=None)
    cache = UnifiedRadixCache(params=params)  # backend chosen from the environment register() set
    assert isinstance(cache.tree_core, UnifiedTreeCore)
    with pytest.raises(ValueError, match="kvflow"):
        UnifiedRadixCache(params=replace(params, tree_core_backend="rust"))
