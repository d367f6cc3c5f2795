"""benchmarks/sglang_gpu.sh cannot run without a GPU. Here: it and its helper parse; the helper's
GPU-free parts do what the script relies on; the smoke prompt gets "Paris" from SmolLM2 (embedded
engine, slow); and a CPU rehearsal runs the script end to end with the launch stubbed
(tests/sglang/stub_sglang_server.py), every command line it built then fed to SGLang's parser."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shutil
import socket
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


def test_report_shows_both_runs_of_each_configuration(tmp_path):
    paths = []
    for label, times in (("stock-lru", (30.0, 33.0)), ("kvflow", (20.0, 22.0))):
        for run, seconds in enumerate(times, 1):
            path = tmp_path / f"{label}-{run}.json"
            path.write_text(json.dumps({"label": label, "run": run, "seconds": seconds, "calls": 30, "kvflow": {}}))
            paths.append(str(path))
    out = subprocess.run([sys.executable, str(HELPER), "report", *paths], capture_output=True, text=True, check=True)
    assert "run 1" in out.stdout and "run 2" in out.stdout and "33.00s" in out.stdout
    assert "speedup kvflow vs stock-lru: 1.50x 1.50x" in out.stdout


def _helper():
    spec = importlib.util.spec_from_file_location("sglang_gpu_workload", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counters_that_show_kvflow_idle_fail_the_run():
    helper = _helper()
    helper.check_acted("kvflow", {"hinted_requests": 40, "tagged_requests": 40}, 40)
    with pytest.raises(SystemExit, match="kvflow did not act: 0 of 40"):
        helper.check_acted("kvflow", {"hinted_requests": 0, "tagged_requests": 0}, 40)
    with pytest.raises(SystemExit, match="0 prefixes tagged"):
        helper.check_acted("kvflow", {"hinted_requests": 40, "tagged_requests": 0}, 40)


@pytest.mark.slow
async def test_the_smoke_prompt_gets_paris_from_smollm2():
    """The exact messages the script's smoke test sends, greedy, through the embedded engine's
    SmolLM2-135M (HF transformers agrees; SGLang serves the same weights)."""
    from backends.base import GenerateRequest, SamplingParams
    from backends.local import Engine, EngineConfig

    helper = _helper()
    engine = Engine(EngineConfig.build(model="smollm2-135m", device_tokens=2048, host_tokens=0))
    try:
        enc = engine.tokenizer.encode_chat(helper.SMOKE_MESSAGES)
        result = await engine.generate(GenerateRequest(enc.input_ids, SamplingParams(max_tokens=24)))
        assert helper.answers_paris(result.text), result.text
    finally:
        await engine.shutdown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rehearse(tmp_path: Path, mode: str = "") -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the script with the launch stubbed, no install, a fake SmolLM2 export and a fake
    nvidia-smi nowhere needed; returns the run and the launch plans the stub received."""
    smollm2 = tmp_path / "smollm2"
    smollm2.mkdir()
    (smollm2 / "config.json").write_text(json.dumps({"vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2}))
    log = tmp_path / "launches.jsonl"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "KVFLOW_SKIP_INSTALL": "1",
           "KVFLOW_STUB_LAUNCH": f"{sys.executable} {ROOT / 'tests' / 'sglang' / 'stub_sglang_server.py'}",
           "STUB_LOG": str(log), "STUB_MODE": mode, "SMOLLM2_DIR": str(smollm2), "WORK": str(tmp_path),
           "PORT": str(_free_port())}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    plans = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return out, plans


@pytest.mark.sglang
def test_rehearsal_runs_the_script_end_to_end_and_sglang_accepts_every_launch(plugin, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    out, plans = _rehearse(tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "plugin: sglang.srt.plugins kvflow = backends.sglang_kvflow:register" in out.stdout
    assert "host memory:" in out.stdout and "smoke: 'The capital of France is Paris.'" in out.stdout
    for label in ("stock-lru", "stock-hicache", "kvflow"):
        for run in (1, 2):
            assert f"{label} run {run}:" in out.stdout
    assert "speedup kvflow vs stock-lru:" in out.stdout and "total wall time" in out.stdout

    assert len(plans) == 4  # smoke, then the three configurations
    for plan in plans:
        argv = plan["argv"]
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        args = prepare_server_args(argv[3:])  # SGLang's own parser, the plugin registered
        # every configuration on the Python radix tree core (kvflow's), every pool sized here
        assert plan["env"]["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
        assert args.max_total_tokens is not None
        assert args.enable_hierarchical_cache == ("--hicache-ratio" in argv)
    policies = [prepare_server_args(p["argv"][3:]).radix_eviction_policy for p in plans]
    assert policies == ["kvflow", "lru", "lru", "kvflow"]
    assert [p["env"].get("KVFLOW_SGLANG_PLUGIN") for p in plans] == [None, "off", "off", None]


@pytest.mark.sglang
@pytest.mark.parametrize("mode, message", [
    ("die", "exited before"),           # the health wait notices a dead server at once
    ("idle", "kvflow did not act"),     # a plugin that did not act fails the run, clearly
])
def test_rehearsal_fails_clearly(plugin, tmp_path, mode, message):
    out, plans = _rehearse(tmp_path, mode)
    assert out.returncode != 0 and message in out.stderr, out.stderr[-3000:]
    assert len(plans) == 1  # it stopped at the first server
