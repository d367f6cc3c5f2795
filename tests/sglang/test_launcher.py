"""``kvflow serve --engine sglang`` builds the right SGLang command line.

The command-line tests run anywhere; the last one (marked ``sglang``) feeds the command to SGLang's
own argument parser with the plugin registered.
"""

from __future__ import annotations

import argparse
import json

import pytest

from backends.sglang_kvflow.launcher import build_command, main, plan_from_args


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_kvflow_policy_turns_on_hicache_write_through_and_the_plugin():
    plan = build_command("/models/llama", ["--tp-size", "2"], port=31000, device_tokens=60000, host_tokens=240000)
    argv = plan.argv
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert _after(argv, "--model-path") == "/models/llama" and _after(argv, "--port") == "31000"
    assert _after(argv, "--host") == "127.0.0.1"
    assert "--enable-hierarchical-cache" in argv and _after(argv, "--hicache-write-policy") == "write_through"
    assert _after(argv, "--radix-eviction-policy") == "kvflow"
    assert _after(argv, "--max-total-tokens") == "60000" and _after(argv, "--hicache-ratio") == "4"
    assert argv[-2:] == ["--tp-size", "2"]  # SGLang flags pass through, last, so the user's win
    assert plan.env == {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}


def test_lru_policy_is_stock_sglang_with_the_plugin_off():
    plan = build_command("/m", ["--enable-hierarchical-cache"], policy="lru")
    assert _after(plan.argv, "--radix-eviction-policy") == "lru"
    assert plan.argv.count("--enable-hierarchical-cache") == 1  # only because the user asked
    assert "--hicache-write-policy" not in plan.argv
    assert plan.env == {"KVFLOW_SGLANG_PLUGIN": "off"}


def test_no_prefetch_api_key_and_no_host_tier():
    plan = build_command("/m", prefetch=False, api_key="s3cret", device_tokens=1000, host_tokens=0)
    assert json.loads(_after(plan.argv, "--radix-eviction-policy-config")) == {"prefetch": False}
    assert _after(plan.argv, "--api-key") == "s3cret"
    assert "--enable-hierarchical-cache" not in plan.argv  # host 0 = no host tier


def test_no_continuations_reaches_the_policy_config():
    plan = build_command("/m", continuations=False)
    assert json.loads(_after(plan.argv, "--radix-eviction-policy-config")) == {"continuations": False}
    both = build_command("/m", prefetch=False, continuations=False)
    assert json.loads(_after(both.argv, "--radix-eviction-policy-config")) == {"prefetch": False,
                                                                               "continuations": False}
    assert "--radix-eviction-policy-config" not in build_command("/m").argv


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "smollm2-135m"}, "export-model"),
    ({"model": "/m", "host_tokens": 10}, "--device-tokens"),
    ({"model": "/m", "policy": "fifo"}, "policy"),
    ({"model": "/m", "tree_core": "rust"}, "Python radix tree core"),
    ({"model": "/m", "policy": "lru", "tree_core": "c++"}, "tree core"),
    ({"model": "/m", "extra_argv": ["--disable-radix-cache"]}, "--host-tokens 0"),
])
def test_bad_combinations_are_refused_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_command(**kwargs)


def test_a_stock_baseline_can_run_on_the_python_tree_core_kvflow_needs():
    stock = build_command("/m", policy="lru", tree_core="python")
    assert stock.env == {"KVFLOW_SGLANG_PLUGIN": "off", "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}
    assert build_command("/m", policy="lru").env == {"KVFLOW_SGLANG_PLUGIN": "off"}  # SGLang's default core
    no_host = build_command("/m", ["--disable-radix-cache"], device_tokens=100, host_tokens=0)
    assert "--enable-hierarchical-cache" not in no_host.argv


def test_plan_from_serve_arguments_and_usage_errors(capsys):
    args = argparse.Namespace(model="/m", policy="kvflow", host="127.0.0.1", port=30001, api_key=None,
                              device_tokens=None, host_tokens=None, no_prefetch=False, engine="sglang")
    plan = plan_from_args(args, ["--load-format", "dummy"])
    assert plan.argv[-2:] == ["--load-format", "dummy"] and _after(plan.argv, "--port") == "30001"
    assert main(argparse.Namespace(model="tiny-random"), []) == 2
    assert "export-model" in capsys.readouterr().err


@pytest.mark.sglang
def test_sglang_parses_the_command_line(plugin):
    from sglang.srt.server_args import prepare_server_args

    argv = build_command("/models/llama", ["--mem-fraction-static", "0.5"], device_tokens=4096).argv
    server_args = prepare_server_args(argv[3:])
    assert server_args.radix_eviction_policy == "kvflow"
    assert server_args.enable_hierarchical_cache and server_args.hicache_write_policy == "write_through"
    assert server_args.max_total_tokens == 4096 and server_args.mem_fraction_static == 0.5

    # SGLang's start-up check refuses --disable-radix-cache with the host tier, which is why
    # build_command refuses it first, with the way out; with the host tier off SGLang accepts it.
    from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility

    with pytest.raises(ValueError, match="mutually exclusive"):
        handle_cache_compatibility(prepare_server_args([*argv[3:], "--disable-radix-cache"]))
    argv = build_command("/m", ["--disable-radix-cache"], device_tokens=4096, host_tokens=0).argv
    handle_cache_compatibility(prepare_server_args(argv[3:]))
