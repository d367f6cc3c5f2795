"""Helpers of the scale-out tests: real kvflow workers (in-process servers with observers, or
``kvflow serve`` subprocesses) behind a real smg gateway, all on 127.0.0.1. The tests skip, naming
the reason, where smg is not installed."""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import httpx
import pytest

from backends.local import Engine, EngineConfig
from backends.server import create_app, serve_in_thread
from kvflow_orch.harness.cluster import GATEWAY_FAULT_FLAGS, HOST, free_port, find_smg
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

SMG_MISSING = "smg (SGLang's model gateway) is not installed: pip install 'kvflow[smg]' (bash .ci/setup-smg)"


class Worker(NamedTuple):
    url: str
    hints: list[KVFlowHint]
    """The hint of every request the worker handed to its engine, as it arrived."""
    steps: list[StepsUpdate]


class Gateway(NamedTuple):
    url: str
    workers: list[Worker]


def require_smg() -> str:
    smg = find_smg()
    if smg is None:
        pytest.skip(SMG_MISSING)
    return smg


@contextmanager
def in_process_worker(device_tokens: int = 4096) -> Iterator[Worker]:
    engine = Engine(EngineConfig.build(model="tiny-random", device_tokens=device_tokens, host_tokens=0))
    hints: list[KVFlowHint] = []
    steps: list[StepsUpdate] = []
    app = create_app(engine, on_request=lambda _, req: req.hint and hints.append(req.hint), on_steps=steps.append)
    with serve_in_thread(app) as running:
        yield Worker(running.url, hints, steps)


@contextmanager
def smg_gateway(worker_urls: list[str], policy: str = "manual") -> Iterator[str]:
    smg = require_smg()
    port = free_port()
    url = f"http://{HOST}:{port}"
    proc = subprocess.Popen(
        [smg, "launch", "--host", HOST, "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy,
         "--prometheus-host", HOST, "--prometheus-port", str(free_port()), *GATEWAY_FAULT_FLAGS, "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"smg exited with code {proc.returncode}"
            try:
                listed = httpx.get(url + "/workers", timeout=2).json()["workers"]
                if sum(w["is_healthy"] for w in listed) == len(worker_urls):
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, "smg did not list every worker healthy within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(check, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


