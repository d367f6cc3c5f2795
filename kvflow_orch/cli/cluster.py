"""``kvflow cluster``: N local ``kvflow serve`` workers and SGLang's model gateway (``smg``) in front.

    kvflow cluster --workers N --model M [--gateway-port P] [--gateway-policy POLICY] [SERVE FLAGS...]

For development and tests on one machine: every process binds 127.0.0.1. Serve flags
(``--device-tokens``, ``--host-tokens``, ``--policy``, ``--no-prefetch``, ``--debug-routes``,
``--api-key``) go to every worker. It prints one line per worker (``worker I: URL``) and then
``gateway: URL``, and runs until Ctrl-C or until a process exits; then it stops them all. In
production each worker is ``kvflow serve`` (or ``--engine sglang``) on its own GPU and ``smg launch``
runs in front. smg is an optional extra: ``pip install 'kvflow[smg]'``.

The gateway checks worker health every second and retries a failed request on another worker, so
a worker lost mid-run costs a few seconds, not a workflow (clients retry too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, NamedTuple

import httpx

from . import serve
from .startup import port_number, positive_int

__all__ = ["add_arguments", "main", "Cluster", "start_cluster", "find_smg", "free_port", "GATEWAY_POLICIES"]

PASS_THROUGH_ARGS = True
GATEWAY_POLICIES = ("manual", "round_robin", "cache_aware", "power_of_two", "random", "least_load")
HOST = "127.0.0.1"
_OWN_FLAGS = ("--port", "--host", "--model", "--engine")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=positive_int, required=True, metavar="N", help="how many workers to start")
    parser.add_argument("--model", type=serve._model, required=True,
                        help="smollm2-135m, tiny-random, or a Hugging Face model directory")
    parser.add_argument("--gateway-port", type=port_number, default=serve.DEFAULT_PORT, metavar="P",
                        help=f"the gateway's port (default: {serve.DEFAULT_PORT}); workers take free ports")
    parser.add_argument("--gateway-policy", choices=GATEWAY_POLICIES, default="manual",
                        help="smg's routing policy (default: manual, sticky by the x-smg-routing-key header)")
    parser.add_argument("--startup-timeout", type=positive_int, default=300, metavar="S",
                        help="seconds to wait for the workers and the gateway (default: 300)")


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
    then stop them all (SIGTERM, then SIGKILL after 10 s). ``log``: where the children's output goes
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
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
            urls.append(f"http://{HOST}:{port}")
        for i, (url, proc) in enumerate(zip(urls, procs)):
            _wait_until(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, proc, f"worker {i} ({url})",
                        deadline)
        port = gateway_port or free_port()
        gateway = f"http://{HOST}:{port}"
        cmd = [smg, "launch", "--host", HOST, "--port", str(port), "--worker-urls", *urls,
               "--policy", gateway_policy, "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
               "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
               "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "2000", "--log-level", "warn"]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
        _wait_until(lambda: _healthy_workers(gateway) == workers, procs[-1], f"the gateway ({gateway})", deadline)
        yield Cluster(gateway, urls, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _serve_flags(args: argparse.Namespace) -> list[str]:
    """The pass-through flags, checked by ``kvflow serve``'s own parser (errors name the flag)."""
    extra = list(getattr(args, "extra_argv", []))
    for flag in extra:
        if flag.split("=", 1)[0] in _OWN_FLAGS:
            raise ValueError(f"{flag.split('=', 1)[0]} is set by kvflow cluster for every worker; remove it")
    parser = argparse.ArgumentParser(prog="kvflow cluster (serve flags)", add_help=False)
    serve.add_arguments(parser)
    parsed, unknown = parser.parse_known_args(extra)
    if unknown:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)}")
    if parsed.engine != "local":
        raise ValueError("kvflow cluster starts embedded-engine workers only")
    return extra


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    try:
        flags = _serve_flags(args)
    except ValueError as exc:
        print(f"kvflow cluster: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # stop the children on `kill` as on Ctrl-C
    if find_smg() is None:
        print("kvflow cluster: smg (SGLang's model gateway) is not installed: pip install 'kvflow[smg]'",
              file=sys.stderr)
        return 2
    try:
        with start_cluster(args.workers, args.model, flags, gateway_port=args.gateway_port,
                           gateway_policy=args.gateway_policy, startup_timeout_s=args.startup_timeout,
                           log=sys.stderr) as cluster:  # stdout carries only the URLs
            for i, url in enumerate(cluster.workers):
                print(f"worker {i}: {url}", flush=True)
            print(f"gateway: {cluster.gateway}", flush=True)
            while all(proc.poll() is None for proc in cluster.processes):
                time.sleep(0.5)
            gone = [i for i, proc in enumerate(cluster.processes) if proc.poll() is not None]
            print(f"kvflow cluster: process {gone[0]} exited; stopping the others", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"kvflow cluster: {exc}", file=sys.stderr)
        return 1
