"""A local cluster for development and tests: N ``kvflow serve`` workers on 127.0.0.1 and SGLang's
model gateway (``smg``) in front, started together, checked healthy and stopped together.

``kvflow cluster`` runs one in the foreground; ``benchmarks/scaleout.py`` and ``tests/scaleout``
start one around a measurement. Each worker is a ``kvflow serve`` subprocess (the CLI), so a worker
here is exactly what a user starts. smg is an optional extra: ``pip install 'kvflow[smg]'``.

Every process leads a session of its own and is stopped with all it started
(:mod:`backends.process_group`), so nothing of a cluster outlives it, even when the caller is killed.

The gateway checks worker health every second and retries a failed request on another worker, so
a worker lost mid-run costs a few seconds, not a workflow (clients retry too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, NamedTuple

import httpx

from backends import process_group

__all__ = ["Cluster", "start_cluster", "find_smg", "free_port", "HOST", "GATEWAY_POLICIES"]

GATEWAY_POLICIES = ("manual", "round_robin", "cache_aware", "power_of_two", "random", "least_load")
"""smg's routing policies (``--policy``)."""
HOST = "127.0.0.1"


class Cluster(NamedTuple):
    gateway: str
    workers: list[str]
    processes: list[subprocess.Popen[bytes]]
    """The workers' processes in order, then the gateway's."""


def find_smg() -> str | None:
    """The ``smg`` executable: next to this Python first (a venv), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "smg")
    return local if os.access(local, os.X_OK) else shutil.which("smg")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _wait_until(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, deadline: float) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready in time")
        time.sleep(0.2)


def _healthy_workers(gateway: str) -> int:
    data = httpx.get(gateway + "/workers", timeout=2).json()
    return sum(1 for w in data.get("workers", []) if w.get("is_healthy"))


@contextlib.contextmanager
def start_cluster(workers: int, model: str, serve_flags: list[str], *, gateway_port: int | None = None,
                  gateway_policy: str = "manual", startup_timeout_s: float = 300.0,
                  log: Any = subprocess.DEVNULL) -> Iterator[Cluster]:
    """Start the workers and the gateway, wait until the gateway lists every worker healthy, yield,
    then stop them all (SIGTERM, then SIGKILL to whatever of them is left after
    :data:`~backends.process_group.STOP_GRACE_S`). ``log``: where the children's output goes
    (a file object or descriptor, as ``subprocess`` takes it)."""
    smg = find_smg()
    if smg is None:
        raise FileNotFoundError("smg is not installed: pip install 'kvflow[smg]' (SGLang's model gateway)")
    procs: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + startup_timeout_s
    try:
        urls = []
        for _ in range(workers):
            port = free_port()
            cmd = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", model, "--host", HOST,
                   "--port", str(port), *serve_flags]
            procs.append(process_group.start(cmd, die_with_parent=True, stdout=log, stderr=log))
            urls.append(f"http://{HOST}:{port}")
        for i, (url, proc) in enumerate(zip(urls, procs, strict=True)):
            _wait_until(lambda url=url: httpx.get(url + "/health", timeout=2).status_code == 200, proc,
                        f"worker {i} ({url})", deadline)
        port = gateway_port or free_port()
        gateway = f"http://{HOST}:{port}"
        cmd = [smg, "launch", "--host", HOST, "--port", str(port), "--worker-urls", *urls,
               "--policy", gateway_policy, "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
               "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
               "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "2000", "--log-level", "warn"]
        procs.append(process_group.start(cmd, die_with_parent=True, stdout=log, stderr=log))
        _wait_until(lambda: _healthy_workers(gateway) == workers, procs[-1], f"the gateway ({gateway})", deadline)
        yield Cluster(gateway, urls, procs)
    finally:
        process_group.stop(procs)
