"""``kvflow serve --engine vllm`` exactly as a user types it (no ``--device-tokens``, no ``VLLM_*``
variables): it starts, serves a chat completion, and after SIGTERM no process of it (API server,
engine core, worker) is left within 10 s and its port is free."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from process_tree import assert_stops, requires_proc, tree, wait_healthy
from vllm_server import HAVE_VLLM, SKIP_REASON, START_TIMEOUT_S, free_port, export_smollm2, plain_env

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON), requires_proc,
              pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]


def test_plain_kvflow_serve_engine_vllm_serves_then_stops_with_everything_it_started(tmp_path: Path) -> None:
    model, port = export_smollm2(tmp_path), free_port()
    env = plain_env()
    assert not [k for k in env if k.startswith("VLLM_")]
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kvflow_orch.cli", "serve", "--engine", "vllm",
                                 "--model", str(model), "--port", str(port)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(proc, url, START_TIMEOUT_S, "kvflow serve --engine vllm")
        except AssertionError as exc:
            log_tail = (tmp_path / "server.log").read_text(errors="replace")[-4000:]
            raise AssertionError(f"{exc}; log:\n{log_tail}") from None
        reply = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "model": str(model), "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        pids = tree(proc.pid)
        assert len(pids) >= 3, pids  # kvflow serve, vLLM's API server, its engine core (and more)
    except BaseException:
        proc.kill()
        raise
    assert_stops(proc, signal.SIGTERM, pids, ports=[port])
