"""benchmarks/sglang_gpu.sh cannot run without a GPU; here (main venv, no sglang needed) we check
that it and its helper parse, and that the helper's GPU-free parts do what the script relies on."""

from __future__ import annotations

import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sglang_gpu.sh"
HELPER = ROOT / "benchmarks" / "sglang_gpu_workload.py"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_script_parses_and_fails_cleanly_without_a_gpu(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    py_compile.compile(str(HELPER), doraise=True)
    if shutil.which("nvidia-smi") is None:
        out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "WORK": str(tmp_path)})
        assert out.returncode != 0 and "needs a CUDA GPU" in out.stderr


def test_llama8b_config_has_the_8b_shape_and_smollm2_tokenizer(tmp_path):
    small = tmp_path / "smollm2"
    small.mkdir()
    (small / "config.json").write_text(json.dumps({"vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2}))
    (small / "tokenizer.json").write_text("{}")
    out = tmp_path / "llama8b"
    subprocess.run([sys.executable, str(HELPER), "llama8b-config", str(small), str(out)], check=True)
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (4096, 32, 8)
    assert config["vocab_size"] == 49152 and (out / "tokenizer.json").exists()


def test_report_prints_ratios_measured_in_one_run(tmp_path):
    paths = []
    for label, seconds in (("stock-lru", 30.0), ("stock-hicache", 24.0), ("kvflow", 20.0)):
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps({"label": label, "seconds": seconds, "calls": 30, "kvflow": {}}))
        paths.append(str(path))
    out = subprocess.run([sys.executable, str(HELPER), "report", *paths], capture_output=True, text=True, check=True)
    assert "speedup kvflow vs stock-hicache: 1.20x" in out.stdout
    assert "speedup kvflow vs stock-lru: 1.50x" in out.stdout


@pytest.mark.sglang
def test_sglang_accepts_the_flags_the_gpu_script_passes(plugin):
    """SGLang 0.5.23's own parser takes every command line the script launches (an ambiguous or
    renamed flag would otherwise only show on the GPU machine)."""
    import re
    import shlex

    from sglang.srt.server_args import prepare_server_args

    from backends.sglang_kvflow.launcher import build_command

    text = SCRIPT.read_text()
    common = shlex.split(re.search(r"^COMMON=\((.*)\)$", text, re.M).group(1))
    hicache = ["--enable-hierarchical-cache", "--hicache-write-policy", "write_through"]
    for policy, extra in (("kvflow", []), ("lru", []), ("lru", hicache)):
        argv = build_command("/models/llama8b", ["--load-format", "dummy", *common, *extra], policy=policy,
                             device_tokens=24576).argv
        args = prepare_server_args(argv[3:])
        assert args.radix_eviction_policy == policy and args.load_format == "dummy"
        assert args.enable_hierarchical_cache == (policy == "kvflow" or bool(extra))
