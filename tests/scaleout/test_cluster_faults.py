"""A worker SIGKILLed mid-run under ``kvflow cluster`` (the CLI, as users start it): every workflow
completes with the outputs of a run without the fault, and the supervisor has the worker serving
again, through the gateway, within 30 s."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from typing import Iterator, NamedTuple

import httpx
import pytest

from kvflow_orch import END, START, Workflow, arun
from kvflow_orch.clients import GatewayClient
from kvflow_orch.clients.gateway import ROUTING_HEADER, WORKER_HEADER
from kvflow_orch.harness.cluster import free_port
from scaleout_helpers import require_smg, wait_for

KVFLOW = [sys.executable, "-m", "kvflow_orch.cli"]
WORKFLOWS = 16
AGENTS = 3
RECOVERY_S = 30.0


class RunningCluster(NamedTuple):
    pid: int
    gateway: str
    workers: list[str]
    stderr_path: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    require_smg()
    stderr_path = str(tmp_path_factory.mktemp("cluster") / "stderr.log")
    port = free_port()
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([*KVFLOW, "cluster", "--workers", "3", "--model", "tiny-random", "--gateway-port",
                                 str(port), "--restart-delay", "0.2", "--device-tokens", "4096", "--host-tokens", "0"],
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(4)]  # type: ignore[union-attr]
        assert lines[3] == f"gateway: http://127.0.0.1:{port}", (lines, open(stderr_path).read()[-2000:])
        yield RunningCluster(proc.pid, lines[3].split(": ", 1)[1], [line.split(": ", 1)[1] for line in lines[:3]],
                             stderr_path)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0


def _pipeline() -> Workflow:
    wf = Workflow("relay")
    names = [f"agent{i}" for i in range(AGENTS)]
    for name in names:
        wf.add_agent(name, f"You are {name} of a relay team. " * 4, "Pass it on: {task}", output="task", max_tokens=3)
    for a, b in zip([START, *names], [*names, END], strict=True):
        wf.add_edge(a, b)
    return wf


class KillingClient(GatewayClient):
    """The real gateway client; once ``kill_at`` replies have come back it SIGKILLs ``victim``."""

    def __init__(self, gateway: str, victim: int | None, kill_at: int) -> None:
        super().__init__(gateway)
        self.victim, self.kill_at, self.replies = victim, kill_at, 0
        self.killed_at: float | None = None

    async def chat(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        reply = await super().chat(*args, **kwargs)
        self.replies += 1
        if self.victim is not None and self.replies == self.kill_at:
            os.kill(self.victim, signal.SIGKILL)  # no goodbye: its requests in flight are cut
            self.killed_at = time.monotonic()
        return reply


def _run_all(client: KillingClient, tag: str) -> list[str]:
    async def go() -> list[str]:
        try:
            runs = (arun(_pipeline(), {"task": f"job {i}"}, backend=client, workflow_id=f"{tag}{i}", namespace="relay")
                    for i in range(WORKFLOWS))
            results = await asyncio.gather(*runs)
        finally:
            await client.aclose()
        return [r.state["task"] for r in results]

    return asyncio.run(go())


def _worker_pid(cluster_pid: int, url: str) -> int:
    """The pid of the ``kvflow serve`` child of ``kvflow cluster`` that listens at ``url``."""
    port = url.rsplit(":", 1)[1]
    with open(f"/proc/{cluster_pid}/task/{cluster_pid}/children") as f:
        children = [int(pid) for pid in f.read().split()]
    for pid in children:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        if "serve" in argv and argv[argv.index("--port") + 1] == port:
            return pid
    raise AssertionError(f"no worker process listens at {url}: children {children}")


def _healthy_at_gateway(gateway: str, url: str) -> bool:
    try:
        listed = httpx.get(gateway + "/workers", timeout=2).json()["workers"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return any(w["url"] == url and w["is_healthy"] for w in listed)


def _routed_to(gateway: str, url: str) -> bool:
    """Whether one of a few fresh routing keys lands on ``url`` and is served there."""
    for key in range(24):
        body = {"model": "tiny-random", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(gateway + "/v1/chat/completions", timeout=60, headers={ROUTING_HEADER: f"probe/{key}"},
                           json=body)
        if reply.status_code == 200 and reply.headers.get(WORKER_HEADER) == url:
            return True
    return False


@pytest.mark.timeout(600)  # the start of three workers included; about a minute on an idle 2-core machine
def test_a_worker_killed_mid_run_loses_nothing_and_serves_again(cluster: RunningCluster,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    baseline = _run_all(KillingClient(cluster.gateway, None, 0), "calm")
    victim_url = cluster.workers[0]
    victim = _worker_pid(cluster.pid, victim_url)
    client = KillingClient(cluster.gateway, victim, kill_at=WORKFLOWS * AGENTS // 3)
    with caplog.at_level(logging.INFO, logger="kvflow.runtime"):
        outputs = _run_all(client, "storm")
    retries = [r for r in caplog.records if "; retry " in r.getMessage()]
    assert client.killed_at is not None and client.replies == WORKFLOWS * AGENTS  # every call answered
    assert outputs == baseline  # greedy replies, whichever worker computed them
    left = RECOVERY_S - (time.monotonic() - client.killed_at)
    wait_for(lambda: _healthy_at_gateway(cluster.gateway, victim_url), left,
             "the gateway to list the restarted worker healthy")
    assert _routed_to(cluster.gateway, victim_url)
    recovered_s = time.monotonic() - client.killed_at
    assert recovered_s < RECOVERY_S
    assert _worker_pid(cluster.pid, victim_url) != victim
    log = open(cluster.stderr_path).read()
    assert re.search(rf"worker 0 \({re.escape(victim_url)}\) exited with code -9; starting it again in 0\.2 s", log)
    assert f"worker 0 ({victim_url}) restarted (restart 1)" in log
    print(f"\nkilled worker 0 after {client.kill_at} of {WORKFLOWS * AGENTS} calls; serving through the gateway again "
          f"{recovered_s:.1f} s later; client retries: {len(retries)}")
