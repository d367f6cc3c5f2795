"""``kvflow serve --engine vllm``: start vLLM's own OpenAI server with kvflow inside.

    kvflow serve --engine vllm --model HF_DIR [--policy kvflow|lru] [--device-tokens N]
                 [--host-tokens M] [--port P] [--host H] [--api-key K] [VLLM FLAGS...]

Both policies run ``vllm serve DIR --enable-prefix-caching`` with the kvflow endpoint plugin
(``/kvflow/v1/{info,steps,stats}``, hints accepted under ``custom_params.kvflow`` as well as
``kv_transfer_params.kvflow``). ``kvflow`` adds ``--scheduler-cls`` :class:`KVFlowScheduler`
(workflow-aware order of vLLM's free block queue); ``lru`` is stock vLLM's scheduler, for
side-by-side comparisons. ``--device-tokens`` sizes the KV pool through
``--num-gpu-blocks-override`` (rounded up to whole blocks, plus vLLM's null block); ``--host-tokens`` sizes vLLM's CPU
offloading tier (``--kv-offloading-size``, CUDA only: vLLM refuses it on CPU). Every flag kvflow
does not know goes to vLLM unchanged, after ours, so it wins.

On vLLM's CPU build the memory vLLM reserves follows from the pool: ``--kv-cache-memory-bytes``
is what ``--device-tokens`` of KV take (without ``--device-tokens``: :data:`DEFAULT_CPU_KV_BYTES`
or one full-length sequence, whichever is larger). Left to itself, vLLM reserves 92% of the
machine's memory and refuses to start when other processes hold more than 8% of it.
``--kv-cache-memory-bytes`` among the pass-through flags, or ``VLLM_CPU_KVCACHE_SPACE`` (GiB, which
vLLM reads over the flag), overrides it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Sequence

from backends import process_group
from backends.launch import LaunchPlan, ServeOptions, run_plan, serve_options
from backends.learn.host import learned_hints_env
from . import CONFIG_ENV, PLUGIN_NAME, POLICY_NAME, SCHEDULER_CLS
from .state import options_from_env

__all__ = ["LaunchPlan", "build_command", "plan_from_args", "main", "block_size_of", "kv_bytes_per_token",
           "CPU_BLOCK_SIZE", "DEFAULT_CPU_KV_BYTES", "is_cpu_build", "running"]

BUILTIN_NAMES = ("smollm2-135m", "tiny-random")
OFFLOAD_POLICY, OFFLOAD_MODULE = "KVFlowCachePolicy", "backends.vllm_kvflow.offload"  # see offload.py
CPU_BLOCK_SIZE = 128  # vLLM's CPU backend default; --block-size in the pass-through flags overrides it
DEFAULT_CPU_KV_BYTES = 2**30  # what the benchmarks and tests reserved before kvflow sized it
# vLLM's flags that choose compilation (-O3, -O 2, -cc.mode=none, --compilation-config=...)
_COMPILATION_FLAGS = ("--enforce-eager", "--no-enforce-eager", "--compilation-config", "-cc", "-O")
SMALL_HOST_CPUS = 4  # at most this many cores: vLLM's reserved frontend core is given back to compute
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def block_size_of(extra_argv: Sequence[str]) -> int:
    value = _flag_value(extra_argv, "--block-size")
    if value is None:
        return CPU_BLOCK_SIZE
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"--block-size must be an integer, got {value!r}") from None
    if size <= 0:
        raise ValueError(f"--block-size must be > 0, got {size}")
    return size


def kv_bytes_per_token(model_dir: str, dtype: str | None = None) -> int:
    """KV bytes one token takes in every layer (keys and values), from the model's config.json."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot size the KV tier from {model_dir}/config.json: {exc}") from None
    name = (dtype or config.get("torch_dtype") or config.get("dtype") or "bfloat16").replace("torch.", "")
    if name == "auto":
        name = config.get("torch_dtype") or "bfloat16"
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(name, 2)


def _model_max_len(model_dir: str) -> int | None:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        return int(config["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_cpu_build() -> bool:
    """Whether the vLLM in this Python is its CPU build, as vLLM itself decides it (the target device
    variable, else ``+cpu`` in the ``vllm`` version, else the ``vllm-cpu`` package)."""
    if os.environ.get("VLLM_TARGET_DEVICE"):
        return os.environ["VLLM_TARGET_DEVICE"] == "cpu"
    try:
        return "cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere vLLM's CPU build
    emulates it, several times slower than float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return True  # not Linux: leave the model's dtype alone
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_speed_defaults(extra_argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Flags and environment ``kvflow serve --engine vllm`` adds on vLLM's CPU build, each only where
    the user set nothing of the kind (a flag among ``extra_argv``, a variable in the environment):

    - ``--dtype float32`` on a CPU without native bfloat16 (SmolLM2's checkpoint says bfloat16);
    - ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` on a machine of :data:`SMALL_HOST_CPUS` cores or fewer:
      vLLM keeps one core for its API server, half of a 2-core machine's compute;
    - ``--enforce-eager``: torch.compile's warm-up takes most of a start (minutes on 2 cores, and
      every start here, since its cache fails to load back), for no measurable prefill gain.
    """
    argv: list[str] = []
    env: dict[str, str] = {}
    if _flag_value(extra_argv, "--dtype") is None and not _cpu_has_bf16():
        argv += ["--dtype", "float32"]
    if (os.cpu_count() or 1) <= SMALL_HOST_CPUS and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if not any(arg.startswith(_COMPILATION_FLAGS) for arg in extra_argv):
        argv += ["--enforce-eager"]
    return argv, env


def _cpu_kv_bytes(model: str, extra_argv: Sequence[str], pool_tokens: int | None) -> int:
    """``--kv-cache-memory-bytes`` on the CPU build: the pool's KV, else the default or one sequence
    of the model's full length, whichever is larger."""
    per_token = kv_bytes_per_token(model, _flag_value(extra_argv, "--dtype"))
    if pool_tokens is not None:
        return pool_tokens * per_token
    given = _flag_value(extra_argv, "--max-model-len")
    longest = int(given) if given is not None and given.isdigit() else _model_max_len(model) or 0
    return max(DEFAULT_CPU_KV_BYTES, longest * per_token)


def build_command(model: str, extra_argv: Sequence[str] = (), *, python: str = sys.executable,
                  cpu: bool | None = None, continuations: bool = True, **options: Any) -> LaunchPlan:
    """Build the ``vllm serve`` command; ``options`` are :class:`~backends.launch.ServeOptions`
    fields; ``cpu``: size the memory vLLM reserves for its CPU build (default: whether this Python's
    vLLM is one); ``continuations``: keep conversations across tool pauses (the scheduler's
    option of that name). Options in ``KVFLOW_VLLM_CONFIG`` reach the scheduler under the flags'.
    Raises ValueError on a combination vLLM cannot express."""
    policy, host, port, api_key, device_tokens, host_tokens, prefetch = ServeOptions(**options)
    if policy not in (POLICY_NAME, "lru"):
        raise ValueError(f"policy must be 'kvflow' or 'lru' with --engine vllm, got {policy!r}")
    if model in BUILTIN_NAMES:
        raise ValueError(f"vLLM serves Hugging Face model directories, not the built-in {model!r}: "
                         f"write one with 'kvflow export-model {model} DIR' and pass --model DIR")
    if "--no-enable-prefix-caching" in extra_argv:
        raise ValueError("--no-enable-prefix-caching turns off the prefix cache kvflow manages")
    if policy == POLICY_NAME and _flag_value(extra_argv, "--scheduler-cls") is not None:
        raise ValueError("--scheduler-cls is kvflow's with --policy kvflow; use --policy lru for another scheduler")
    block_size = block_size_of(extra_argv)
    passthrough = list(extra_argv)
    on_cpu = is_cpu_build() if cpu is None else cpu
    argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", host, "--port", str(port),
            "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    env = {"VLLM_PLUGINS": PLUGIN_NAME}
    if on_cpu:
        cpu_argv, cpu_env = cpu_speed_defaults(extra_argv)
        argv += cpu_argv
        env.update(cpu_env)
        extra_argv = [*cpu_argv, *extra_argv]  # the memory sizing below reads the dtype chosen here
    pool_tokens = None
    if device_tokens is not None:
        if device_tokens <= 0:
            raise ValueError(f"--device-tokens must be > 0, got {device_tokens}")
        # vLLM keeps block 0 as its null block: N tokens of KV need one block more
        blocks = math.ceil(device_tokens / block_size) + 1
        argv += ["--num-gpu-blocks-override", str(blocks)]
        pool_tokens = blocks * block_size
        if _flag_value(extra_argv, "--max-model-len") is None:
            # vLLM refuses to start when one sequence of the model's full length cannot fit the pool
            usable = (blocks - 1) * block_size
            argv += ["--max-model-len", str(min(usable, _model_max_len(model) or usable))]
    if on_cpu and _flag_value(extra_argv, "--kv-cache-memory-bytes") is None:
        argv += ["--kv-cache-memory-bytes", str(_cpu_kv_bytes(model, extra_argv, pool_tokens))]
    if host_tokens:
        gib = host_tokens * kv_bytes_per_token(model, _flag_value(extra_argv, "--dtype")) / 2**30
        argv += ["--kv-offloading-size", f"{gib:.6g}", "--kv-offloading-backend", "native"]
        if policy == POLICY_NAME:
            if _flag_value(extra_argv, "--kv-transfer-config") is not None:
                raise ValueError("--host-tokens with --policy kvflow sets --kv-transfer-config itself "
                                 "(the host tier's kvflow eviction policy); pass one or the other")
            # vLLM merges cpu_bytes_to_use into this; the tier then evicts in kvflow's order
            argv += ["--kv-transfer-config", json.dumps({"kv_connector_extra_config": {
                "eviction_policy": OFFLOAD_POLICY, "cache_policy_module_path": OFFLOAD_MODULE}})]
    if policy == POLICY_NAME:
        argv += ["--scheduler-cls", SCHEDULER_CLS]
        # the scheduler's own options (KVFLOW_VLLM_CONFIG in the environment), then what the flags set
        options: dict[str, object] = {**options_from_env(), "prefetch": prefetch}
        if host_tokens:
            options["host_tokens"] = host_tokens
        if not continuations:
            options["continuations"] = False
        env[CONFIG_ENV] = json.dumps(options)
    if api_key:
        argv += ["--api-key", api_key]
    argv += passthrough
    return LaunchPlan(argv, env)


def plan_from_args(args: argparse.Namespace, extra_argv: Sequence[str]) -> LaunchPlan:
    """From ``kvflow serve``'s parsed arguments (attributes it may lack take their defaults)."""
    plan = build_command(args.model, extra_argv, continuations=bool(getattr(args, "continuations", True)),
                         **serve_options(args, POLICY_NAME))
    plan.env.update(learned_hints_env(bool(getattr(args, "learned_hints", False))))  # read by the plugin's routes
    return plan


def main(args: argparse.Namespace, extra_argv: Sequence[str] = ()) -> int:
    """Run vLLM in the foreground; returns its exit status (2 for a usage error)."""
    return run_plan(lambda: plan_from_args(args, extra_argv), package="vllm",
                    missing="--engine vllm needs vLLM in this Python (pip install 'kvflow[vllm]', or on CPU "
                            "bash .ci/setup-vllm and use .venv-vllm/bin/python)")

@contextlib.contextmanager
def running(argv: Sequence[str], url: str, log: Path, *, env: dict[str, str] | None = None,
            cwd: str | Path | None = None, timeout_s: float = 900.0) -> Iterator[str]:
    """Run a vLLM server command (``kvflow serve --engine vllm ...``) in a session of its own until
    ``url``/health answers, yield ``url``, then stop it as a process manager would (SIGTERM), with
    everything it started. Raises RuntimeError with the log's tail when it exits or does not start
    in time."""
    with open(log, "wb") as out:
        proc = process_group.start(argv, die_with_parent=True, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} while starting; log:\n"
                                   f"{log.read_text(errors='replace')[-4000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not start within {timeout_s:.0f} s; log:\n"
                                   f"{log.read_text(errors='replace')[-4000:]}")
            time.sleep(2)
        yield url
    finally:
        # kvflow serve gives the engine STOP_GRACE_S before it kills the rest: wait for that to finish
        process_group.stop([proc], grace_s=2 * process_group.STOP_GRACE_S)
