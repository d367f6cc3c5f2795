"""``kvflow serve --engine vllm``'s command line (no vLLM needed: nothing is started)."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from backends.vllm_kvflow import CONFIG_ENV, SCHEDULER_CLS
from backends.vllm_kvflow import launcher
from backends.vllm_kvflow.launcher import (DEFAULT_CPU_KV_BYTES, build_command, is_cpu_build, kv_bytes_per_token,
                                            plan_from_args)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
              "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_kvflow_policy_loads_the_scheduler_the_plugin_and_sizes_the_pool_in_blocks(model_dir: Path) -> None:
    plan = build_command(str(model_dir), ["--max-model-len", "4096"], device_tokens=1000, port=8123, api_key="k")
    argv = plan.argv
    assert argv[argv.index("--scheduler-cls") + 1] == SCHEDULER_CLS
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "9"  # ceil(1000 / 128) + vLLM's null block
    assert "--enable-prefix-caching" in argv and argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--api-key") + 1] == "k" and argv[-2:] == ["--max-model-len", "4096"]
    assert argv.count("--max-model-len") == 1  # the caller's wins; kvflow adds none
    assert plan.env["VLLM_PLUGINS"] == "kvflow" and json.loads(plan.env[CONFIG_ENV]) == {"prefetch": True}


def test_lru_is_stock_vllm_with_the_routes(model_dir: Path) -> None:
    plan = build_command(str(model_dir), ["--block-size", "16"], policy="lru", device_tokens=1000)
    assert "--scheduler-cls" not in plan.argv and CONFIG_ENV not in plan.env
    assert plan.argv[plan.argv.index("--num-gpu-blocks-override") + 1] == "64"  # ceil(1000 / 16) + 1
    assert plan.env["VLLM_PLUGINS"] == "kvflow"
    # vLLM refuses to start when one full-length sequence cannot fit: the pool bounds it
    assert plan.argv[plan.argv.index("--max-model-len") + 1] == "1008"


def test_host_tokens_size_the_offloading_tier_from_the_model_config(model_dir: Path) -> None:
    per_token = kv_bytes_per_token(str(model_dir))
    assert per_token == 2 * 30 * 3 * 64 * 2
    plan = build_command(str(model_dir), host_tokens=2**20)
    gib = float(plan.argv[plan.argv.index("--kv-offloading-size") + 1])
    assert gib == pytest.approx(per_token * 2**20 / 2**30, rel=1e-5)
    assert json.loads(plan.env[CONFIG_ENV])["host_tokens"] == 2**20


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "belady"}, "policy must be"),
    ({"model": "smollm2-135m"}, "export-model"),
    ({"extra_argv": ["--no-enable-prefix-caching"]}, "prefix cache"),
    ({"extra_argv": ["--scheduler-cls", "x.Y"]}, "--scheduler-cls"),
    ({"extra_argv": ["--block-size", "0"]}, "block-size"),
])
def test_bad_combinations_name_the_problem(model_dir: Path, kwargs: dict, message: str) -> None:
    model = kwargs.pop("model", str(model_dir))
    with pytest.raises(ValueError, match=message):
        build_command(model, **kwargs)


def test_missing_config_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        build_command(str(tmp_path), host_tokens=10)


def test_plan_from_serve_arguments(model_dir: Path) -> None:
    args = Namespace(model=str(model_dir), policy="kvflow", host="127.0.0.1", port=30000, api_key=None,
                     device_tokens=None, host_tokens=None, no_prefetch=True)
    plan = plan_from_args(args, ["--dtype", "float32"])
    assert "--num-gpu-blocks-override" not in plan.argv and plan.argv[-2:] == ["--dtype", "float32"]
    assert json.loads(plan.env[CONFIG_ENV]) == {"prefetch": False}


def test_cli_refuses_a_builtin_model_name_with_a_clear_message() -> None:
    out = subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model",
                          "tiny-random"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "kvflow export-model tiny-random DIR" in out.stderr


def test_on_the_cpu_build_vllm_reserves_the_pool_s_memory_not_92_percent_of_the_machine(model_dir: Path) -> None:
    per_token = kv_bytes_per_token(str(model_dir), "float32")
    plan = build_command(str(model_dir), ["--dtype", "float32"], device_tokens=1000, cpu=True)
    # 9 blocks of 128 (one of them vLLM's null block) of float32 KV
    assert plan.argv[plan.argv.index("--kv-cache-memory-bytes") + 1] == str(9 * 128 * per_token)
    assert "--kv-cache-memory-bytes" not in build_command(str(model_dir), device_tokens=1000, cpu=False).argv


def test_without_device_tokens_the_cpu_build_reserves_a_default_or_one_full_length_sequence(model_dir: Path) -> None:
    def reserved(extra: list[str]) -> int:
        argv = build_command(str(model_dir), extra, cpu=True).argv
        return int(argv[argv.index("--kv-cache-memory-bytes") + 1])

    per_token = kv_bytes_per_token(str(model_dir), "bfloat16")
    assert reserved([]) == DEFAULT_CPU_KV_BYTES  # config.json gives no length: the default
    assert reserved(["--max-model-len", "4096"]) == DEFAULT_CPU_KV_BYTES  # 4096 tokens take 90 MiB
    # more than the default: one sequence
    assert reserved(["--max-model-len", "200000", "--dtype", "bfloat16"]) == 200000 * per_token


def test_the_users_memory_flag_wins(model_dir: Path) -> None:
    argv = build_command(str(model_dir), ["--kv-cache-memory-bytes", "123456"], device_tokens=1000, cpu=True).argv
    assert argv.count("--kv-cache-memory-bytes") == 1 and argv[-2:] == ["--kv-cache-memory-bytes", "123456"]


@pytest.mark.parametrize("target, expected", [("cpu", True), ("cuda", False)])
def test_the_cpu_build_is_recognised_as_vllm_recognises_it(monkeypatch: pytest.MonkeyPatch, target: str,
                                                            expected: bool) -> None:
    monkeypatch.setenv("VLLM_TARGET_DEVICE", target)
    assert is_cpu_build() is expected


@pytest.fixture
def small_cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's kind (2 cores, AVX2 only), whatever the machine running the test is."""
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(launcher, "_cpu_has_bf16", lambda: False)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_on_a_small_cpu_host_the_launcher_sets_what_makes_vllm_fast(model_dir: Path, small_cpu_without_bf16) -> None:
    plan = build_command(str(model_dir), device_tokens=1000, cpu=True)
    assert _value(plan.argv, "--dtype") == "float32" and "--enforce-eager" in plan.argv
    assert plan.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    # the memory vLLM reserves is sized in the dtype chosen: 9 blocks of 128 tokens of float32 KV
    assert _value(plan.argv, "--kv-cache-memory-bytes") == str(9 * 128 * kv_bytes_per_token(str(model_dir), "float32"))
    gpu = build_command(str(model_dir), device_tokens=1000, cpu=False)
    assert "--dtype" not in gpu.argv and "--enforce-eager" not in gpu.argv
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in gpu.env


@pytest.mark.parametrize("extra", [["--no-enforce-eager"], ["--enforce-eager"], ["-O3"], ["-O", "2"],
                                   ["--compilation-config", "{}"], ["-cc.mode=none"]])
def test_a_users_compilation_choice_wins(model_dir: Path, small_cpu_without_bf16, extra: list[str]) -> None:
    argv = build_command(str(model_dir), extra, cpu=True).argv
    assert argv.count("--enforce-eager") == extra.count("--enforce-eager") and argv[-len(extra):] == extra


def test_a_users_dtype_and_reserved_cores_win(model_dir: Path, small_cpu_without_bf16,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    plan = build_command(str(model_dir), ["--dtype", "bfloat16"], cpu=True)
    assert plan.argv.count("--dtype") == 1 and _value(plan.argv, "--dtype") == "bfloat16"
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in plan.env  # the user's variable reaches vLLM as it is
    monkeypatch.setattr(launcher, "_cpu_has_bf16", lambda: True)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 32)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU")
    big = build_command(str(model_dir), cpu=True)
    assert "--dtype" not in big.argv and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in big.env


def test_no_continuations_and_the_users_scheduler_options_reach_the_scheduler(model_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    args = Namespace(model=str(model_dir), policy="kvflow", host="127.0.0.1", port=30000, api_key=None,
                     device_tokens=None, host_tokens=None, no_prefetch=False, continuations=False)
    assert json.loads(plan_from_args(args, []).env[CONFIG_ENV]) == {"prefetch": True, "continuations": False}
    monkeypatch.setenv(CONFIG_ENV, '{"tool_default_s": 30, "prefetch": true}')
    args.continuations, args.no_prefetch = True, True
    # the user's options, then what the flags set (--no-prefetch wins over the environment's prefetch)
    assert json.loads(plan_from_args(args, []).env[CONFIG_ENV]) == {"tool_default_s": 30, "prefetch": False}
    for raw, message in (("{", "not valid JSON"), ("[1]", "JSON object")):
        monkeypatch.setenv(CONFIG_ENV, raw)
        with pytest.raises(ValueError, match=message):
            plan_from_args(args, [])
