"""Start ``kvflow serve --engine vllm`` as a subprocess for a test module (vLLM's first start takes
minutes on two cores, so each module starts one server and shares it), and export SmolLM2 once."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "vLLM is not installed in this Python (bash .ci/setup-vllm builds .venv-vllm; run the tests with it)"
START_TIMEOUT_S = float(os.environ.get("KVFLOW_VLLM_START_TIMEOUT_S", "900"))

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)


def export_smollm2(folder: Path) -> Path:
    out = folder / "smollm2"
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "export-model", "smollm2-135m", str(out)],
                       cwd=ROOT, check=True, capture_output=True, timeout=300)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model: Path, log: Path, flags: Sequence[str] = (), *, kv_space_gib: int = 1) -> Iterator[str]:
    """Run ``kvflow serve --engine vllm --model MODEL FLAGS`` until /health answers; yield its URL;
    stop the whole process group afterwards (the API server, engine core and worker)."""
    port = _free_port()
    argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", str(model),
            "--port", str(port), *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} while starting; log:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not start within {START_TIMEOUT_S:.0f} s; log:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
