"""``kvflow cluster`` as users and process managers stop it: after SIGTERM (or SIGINT) no worker,
gateway or anything they started is left within 10 s and every port is free; a SIGKILLed
``kvflow cluster`` still takes its workers and gateway down (their parent-death signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from process_tree import assert_stops, left_after, requires_proc, tree

from kvflow_orch.harness.cluster import find_smg, free_port

pytestmark = [requires_proc,
              pytest.mark.skipif(find_smg() is None, reason="smg is not installed: pip install 'kvflow[smg]'")]
ROOT = Path(__file__).resolve().parents[2]


def _cluster(port: int) -> tuple[subprocess.Popen, list[int], set[int]]:
    """``kvflow cluster --workers 2`` until it prints the gateway; its ports and process tree."""
    proc = subprocess.Popen([sys.executable, "-m", "kvflow_orch.cli", "cluster", "--workers", "2",
                             "--model", "tiny-random", "--gateway-port", str(port),
                             "--device-tokens", "1024", "--host-tokens", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = [proc.stdout.readline().strip() for _ in range(3)]  # type: ignore[union-attr]
    assert lines[2] == f"gateway: http://127.0.0.1:{port}", lines
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    ports = [port, *(int(line.rsplit(":", 1)[1]) for line in lines[:2])]
    pids = tree(proc.pid)
    assert len(pids) >= 4, pids  # kvflow cluster, two workers, the gateway
    return proc, ports, pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_cluster_leaves_no_process_and_frees_every_port(signum: int) -> None:
    proc, ports, pids = _cluster(free_port())
    assert assert_stops(proc, signum, pids, ports) == 0


def test_a_killed_cluster_still_takes_its_workers_and_gateway_down() -> None:
    proc, ports, pids = _cluster(free_port())
    proc.kill()
    proc.wait()
    left = left_after(pids - {proc.pid}, 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} processes outlived their SIGKILLed kvflow cluster"
