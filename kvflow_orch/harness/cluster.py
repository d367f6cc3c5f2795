"""A local cluster for development and tests: N ``kvflow serve`` workers on 127.0.0.1 and SGLang's
model gateway (``smg``) in front, started together, checked healthy and stopped together.

``kvflow cluster`` runs one in the foreground; ``benchmarks/scaleout.py`` and ``tests/scaleout``
start one around a measurement. Each worker is a ``kvflow serve`` subprocess (the CLI), so a worker
here is exactly what a user starts. smg is an optional extra: ``pip install 'kvflow[smg]'``.

Every process leads a session of its own and is stopped with all it started
(:mod:`backends.process_group`), so nothing of a cluster outlives it, even when the caller is killed.

A lost worker costs seconds, not a workflow:

* the :class:`Supervisor` starts a worker that exits again, on the same port (so under the same URL),
  after a backoff that doubles with each exit in a row (:class:`RestartPolicy`);
* the gateway keeps every worker registered (its ``--worker-urls`` are static: smg removes unhealthy
  workers only under service discovery) and probes ``/health`` every second: one failed probe takes
  the worker out of routing, one answered probe puts it back. Its circuit breaker reopens after a
  few seconds, so it never keeps a restarted worker out longer than the restart takes;
* a request cut by the worker's death is retried by smg on another worker, or answered 502/503
  (retriable); kvflow's clients retry those and connection failures, never a reply already read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import httpx

from backends import process_group

__all__ = ["Cluster", "RestartPolicy", "Supervisor", "start_cluster", "find_smg", "free_port", "HOST",
           "GATEWAY_POLICIES"]

GATEWAY_POLICIES = ("manual", "round_robin", "cache_aware", "power_of_two", "random", "least_load")
"""smg's routing policies (``--policy``)."""
HOST = "127.0.0.1"
GATEWAY_FAULT_FLAGS = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                       "--health-success-threshold", "1", "--cb-timeout-duration-secs", "2",
                       "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "2000")
"""How smg in front of the workers notices a lost worker and takes it back (see the module docstring)."""


class Cluster(NamedTuple):
    gateway: str
    workers: list[str]
    processes: list[subprocess.Popen[bytes]]
    """The workers' processes in order, then the gateway's (a restarted worker replaces its entry)."""
    commands: list[list[str]]
    """Each worker's command line (what a restart runs again)."""


def find_smg() -> str | None:
    """The ``smg`` executable: next to this Python first (a venv), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "smg")
    return local if os.access(local, os.X_OK) else shutil.which("smg")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


PORT_RETRIES = 3
"""How often :func:`start_cluster` gives a worker a new port when another process took its own."""


def _port_taken(url: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, int(url.rsplit(":", 1)[1])))
        except OSError:
            return True
    return False


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
        def start_worker() -> tuple[str, list[str], subprocess.Popen[bytes]]:
            port = free_port()
            command = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", model, "--host", HOST,
                       "--port", str(port), *serve_flags]
            return f"http://{HOST}:{port}", command, process_group.start(command, die_with_parent=True,
                                                                         stdout=log, stderr=log)

        urls: list[str] = []
        commands: list[list[str]] = []
        for _ in range(workers):
            url, command, proc = start_worker()
            urls.append(url)
            commands.append(command)
            procs.append(proc)
        for i in range(workers):
            for attempt in range(PORT_RETRIES + 1):
                try:
                    _wait_until(lambda url=urls[i]: httpx.get(url + "/health", timeout=2).status_code == 200,
                                procs[i], f"worker {i} ({urls[i]})", deadline)
                    break
                except RuntimeError:
                    # free_port() only names a port that was free: another process may bind it before
                    # the worker does. Only then (the worker gone, its port held by someone else) does a
                    # new port help; any other failure is the worker's own and is raised as it is.
                    if procs[i].poll() is None or not _port_taken(urls[i]) or attempt == PORT_RETRIES:
                        raise
                    urls[i], commands[i], procs[i] = start_worker()
        port = gateway_port or free_port()
        gateway = f"http://{HOST}:{port}"
        cmd = [smg, "launch", "--host", HOST, "--port", str(port), "--worker-urls", *urls,
               "--policy", gateway_policy, "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
               *GATEWAY_FAULT_FLAGS, "--log-level", "warn"]
        procs.append(process_group.start(cmd, die_with_parent=True, stdout=log, stderr=log))
        _wait_until(lambda: _healthy_workers(gateway) == workers, procs[-1], f"the gateway ({gateway})", deadline)
        yield Cluster(gateway, urls, procs, commands)
    finally:
        process_group.stop(procs)


@dataclass(frozen=True)
class RestartPolicy:
    """When the :class:`Supervisor` starts an exited worker again: ``first_delay_s`` after its first
    exit, doubling with each exit in a row up to ``max_delay_s``; a worker that stayed up
    ``stable_s`` counts from the first again (a crash loop backs off, a rare fault restarts fast)."""

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.first_delay_s <= self.max_delay_s or self.stable_s <= 0:
            raise ValueError("RestartPolicy needs 0 <= first_delay_s <= max_delay_s and stable_s > 0")

    def delay(self, exits_in_a_row: int) -> float:
        return min(self.first_delay_s * 2 ** max(exits_in_a_row - 1, 0), self.max_delay_s)


class Supervisor:
    """Keeps a running cluster's workers alive: call :meth:`check` now and then (or :meth:`run`).

    A worker that exited is started again with its own command line after the policy's delay and
    replaces its entry in ``cluster.processes``. ``say`` gets one line per event (an exit, a restart,
    a worker answering ``/health`` again) for the operator."""

    def __init__(self, cluster: Cluster, policy: RestartPolicy = RestartPolicy(), *, log: Any = subprocess.DEVNULL,
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        if len(cluster.commands) != len(cluster.workers):
            raise ValueError("the cluster names no command line per worker; start it with start_cluster()")
        self.cluster, self.policy, self._log, self._say = cluster, policy, log, say
        now = time.monotonic()
        count = len(cluster.workers)
        self.restarts = [0] * count
        """Restarts of each worker so far."""
        self._exits_in_a_row = [0] * count
        self._started = [now] * count
        self._due: list[float | None] = [None] * count  # when an exited worker starts again
        self._lost_at: list[float | None] = [None] * count  # set from its exit until it answers /health

    @property
    def gateway_alive(self) -> bool:
        return self.cluster.processes[-1].poll() is None

    def check(self) -> bool:
        """One pass over the workers; False once the gateway has exited (nothing is left to serve)."""
        for i in range(len(self.cluster.workers)):
            self._check_worker(i, time.monotonic())
        return self.gateway_alive

    def run(self, interval_s: float = 0.2) -> int:
        """Check until the gateway exits; its exit code."""
        while self.check():
            time.sleep(interval_s)
        return int(self.cluster.processes[-1].returncode)

    def _check_worker(self, i: int, now: float) -> None:
        url, proc = self.cluster.workers[i], self.cluster.processes[i]
        if self._due[i] is not None:
            if now >= self._due[i]:  # type: ignore[operator]
                self.cluster.processes[i] = process_group.start(self.cluster.commands[i], die_with_parent=True,
                                                                stdout=self._log, stderr=self._log)
                self._due[i], self._started[i] = None, now
                self.restarts[i] += 1
                self._say(f"kvflow cluster: worker {i} ({url}) restarted (restart {self.restarts[i]})")
            return
        if proc.poll() is not None:
            self._exits_in_a_row[i] += 1
            delay = self.policy.delay(self._exits_in_a_row[i])
            self._due[i] = now + delay
            if self._lost_at[i] is None:
                self._lost_at[i] = now
            self._say(f"kvflow cluster: worker {i} ({url}) exited with code {proc.returncode}; "
                      f"starting it again in {delay:.1f} s")
            return
        if self._lost_at[i] is not None and _answers_health(url):
            self._say(f"kvflow cluster: worker {i} ({url}) serves again, {now - self._lost_at[i]:.1f} s "  # type: ignore[operator]
                      f"after it was lost")
            self._lost_at[i] = None
        if now - self._started[i] >= self.policy.stable_s:
            self._exits_in_a_row[i] = 0


def _answers_health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
