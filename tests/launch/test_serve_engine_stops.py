"""``kvflow serve --engine sglang`` as users start and stop it: the command serves, and after
SIGTERM or SIGINT nothing of it is left within 10 s and its port is free.

SGLang needs a GPU, so ``python -m sglang.launch_server`` is the stub of
tests/sglang/stub_sglang_server.py (put first on the path as an ``sglang`` package): it logs its
command line, starts helpers that ignore SIGTERM (one escaped into a process group of its own) and
serves /health and a chat completion. Everything else is the real CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from process_tree import assert_stops, requires_proc, tree, wait_healthy

pytestmark = requires_proc
ROOT = Path(__file__).resolve().parents[2]
STUB_DIR = ROOT / "tests" / "sglang"
LAUNCH_SERVER = (f"import sys; sys.path.insert(0, {str(STUB_DIR)!r}); from stub_sglang_server import launch_server; "
                 "raise SystemExit(launch_server())")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stub_sglang(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``sglang.launch_server`` is the stub, with no SGLang or vLLM variables."""
    package = tmp_path / "path" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(LAUNCH_SERVER + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "VLLM_", "KVFLOW_"))}
    return {**env, "PYTHONPATH": os.pathsep.join([str(tmp_path / "path"), str(ROOT)]),
            "STUB_LOG": str(tmp_path / "stub.log"), "STUB_PIDS": str(tmp_path / "pids.json")}


def _serve(model_dir: Path, env: dict[str, str], port: int) -> tuple[subprocess.Popen, set[int]]:
    proc = subprocess.Popen([sys.executable, "-m", "kvflow_orch.cli", "serve", "--engine", "sglang",
                             "--model", str(model_dir), "--port", str(port)], cwd=ROOT, env=env)
    wait_healthy(proc, f"http://127.0.0.1:{port}", 60, "kvflow serve --engine sglang")
    started = json.loads(Path(env["STUB_PIDS"]).read_text())
    return proc, tree(proc.pid) | {started["leader"], *started["helpers"]}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_kvflow_serve_engine_sglang_serves_then_stops_with_everything_it_started(
        tmp_path: Path, stub_sglang: dict[str, str], signum: int) -> None:
    port = _free_port()
    proc, pids = _serve(tmp_path, stub_sglang, port)
    assert len(pids) == 4, pids  # kvflow serve, the engine, its two helpers
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "Capital of France?"}]})
    assert reply.status_code == 200 and "Paris" in reply.json()["choices"][0]["message"]["content"]
    command = json.loads(Path(stub_sglang["STUB_LOG"]).read_text().splitlines()[-1])["argv"]
    assert command[1:3] == ["-m", "sglang.launch_server"] and str(port) in command
    assert_stops(proc, signum, pids, ports=[port])
