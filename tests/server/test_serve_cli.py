"""``kvflow serve`` as a user runs it: a subprocess on tiny-random that binds loopback only, applies
the flags (policy, prefetch, capacities, API key), answers a chat completion and stops on Ctrl-C."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from process_tree import wait_healthy

from kvflow_orch import cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port_hex = local.split(":")
                if int(port_hex, 16) == port and state == "0A":  # 0A: LISTEN
                    found.add(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc/net/tcp")
def test_kvflow_serve_runs_binds_loopback_and_applies_flags() -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", "tiny-random", "--device-tokens", "1024",
           "--host-tokens", "0", "--policy", "lru", "--no-prefetch", "--dtype", "bfloat16",
           "--prefetch-lookahead", "16", "--no-continuations", "--port", str(port), "--api-key", "k"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 90, "kvflow serve")
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else
        auth = {"authorization": "Bearer k"}
        assert httpx.get(f"{url}/kvflow/v1/info").status_code == 401
        info = httpx.get(f"{url}/kvflow/v1/info", headers=auth).json()
        assert info["model"] == "tiny-random" and info["policy"] == "lru" and info["prefetch"] is False
        assert info["tiers"]["device"]["tokens"] == 1024 and info["tiers"]["host"]["tokens"] == 0
        assert info["dtype"] == "bfloat16"
        body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0
    startup = proc.stdout.read() if proc.stdout else ""
    assert "(policy lru, prefetch off, lookahead 16)" in startup  # read back from the engine's brain config
    assert "continuations off" in startup


def test_unknown_flags_are_refused_for_the_embedded_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--model", "tiny-random", "--tp", "2"]) == 2
    assert "unrecognized arguments: --tp 2" in capsys.readouterr().err


def test_bad_model_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--model", "no-such-model"])
    assert exc.value.code == 2 and "no-such-model" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_engine_sglang_is_delegated_and_says_what_is_missing(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["serve", "--engine", "sglang", "--model", str(tmp_path), "--tp", "2"])
    assert rc == 2
    assert "needs the sglang package" in capsys.readouterr().err


def test_bad_dtype_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--model", "tiny-random", "--dtype", "int8"])
    assert exc.value.code == 2 and "--dtype" in capsys.readouterr().err


def test_bad_prefetch_lookahead_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--model", "tiny-random", "--prefetch-lookahead", "-1"])
    assert exc.value.code == 2 and "--prefetch-lookahead" in capsys.readouterr().err


def test_prefetch_lookahead_is_refused_for_external_engines(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["serve", "--engine", "sglang", "--model", str(tmp_path), "--prefetch-lookahead", "4"])
    assert rc == 2 and "radix-eviction-policy-config" in capsys.readouterr().err


def test_no_continuations_is_refused_for_stock_external_engines(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # with --policy kvflow it reaches the plugin (tests/vllm/test_vllm_launcher.py, tests/sglang/test_launcher.py)
    rc = cli.main(["serve", "--engine", "sglang", "--model", str(tmp_path), "--policy", "lru", "--no-continuations"])
    assert rc == 2 and "the stock engine keeps none" in capsys.readouterr().err
