"""Start ``kvflow serve --engine vllm`` as a subprocess for a test module (vLLM's first start takes
minutes on two cores, so each module starts one server and shares it), and export SmolLM2 once."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "vLLM is not installed in this Python (bash .ci/setup-vllm builds .venv-vllm; run the tests with it)"
START_TIMEOUT_S = float(os.environ.get("KVFLOW_VLLM_START_TIMEOUT_S", "900"))

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)


_exported: list[Path] = []  # one export per test process: every module's server reads the same files


def export_smollm2(folder: Path) -> Path:
    """SmolLM2-135M as a Hugging Face folder, written under ``folder`` by this process's first call."""
    if not _exported:
        out = folder / "smollm2"
        if not (out / "config.json").exists():
            subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "export-model", "smollm2-135m", str(out)],
                           cwd=ROOT, check=True, capture_output=True, timeout=300)
        _exported.append(out)
    return _exported[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_env() -> dict[str, str]:
    """This environment without any ``VLLM_*`` variable: the server starts as users type it."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}, "PYTHONPATH": str(ROOT)}


@contextlib.contextmanager
def vllm_server(model: Path, log: Path, flags: Sequence[str] = (), *, port: int | None = None,
                env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``kvflow serve --engine vllm --model MODEL FLAGS`` (no ``VLLM_*`` variables; ``env``
    added) until /health answers; yield its URL."""
    from backends.vllm_kvflow.launcher import running

    port = port or free_port()
    argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", str(model),
            "--port", str(port), *flags]
    env = {**plain_env(), **(env or {})}
    with running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT, timeout_s=START_TIMEOUT_S) as url:
        yield url
