"""What a stop test checks, read from /proc independently of the code under test: a process and
all its descendants, whether they are gone, whether a port is free again; and when a server it
started answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterable

import httpx
import pytest

requires_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                   reason="reads the process tree from /proc (Linux)")


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out.update(int(child) for child in task.read_text().split())
        except OSError:  # it exited while we looked
            pass
    return out


def tree(pid: int) -> set[int]:
    """``pid`` and every live descendant of it."""
    seen, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in seen and alive(current):
            seen.add(current)
            todo.extend(_children(current))
    return seen


def alive(pid: int) -> bool:
    """Running (a zombie holds no port and no memory, and is its parent's to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def left_after(pids: Iterable[int], seconds: float) -> set[int]:
    """Those of ``pids`` still running ``seconds`` from now (returns as soon as none is)."""
    pids, deadline = set(pids), time.monotonic() + seconds
    while True:
        left = {pid for pid in pids if alive(pid)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def port_free(port: int) -> bool:
    """A new server could bind ``port`` now (with SO_REUSEADDR, as servers bind: the closed
    connections' TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def describe(pids: Iterable[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            command = "(gone)"
        out.append(f"{pid}: {command[:200]}")
    return out


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, what: str = "the server") -> None:
    """Until ``url``/health answers 200; fails at once if ``proc`` exits (naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"{what} exited with {proc.returncode} while starting"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{what} did not answer /health within {timeout_s:.0f} s"
        time.sleep(0.2)


def assert_stops(proc: subprocess.Popen, signum: int, pids: set[int], ports: Iterable[int],
                 within_s: float = 10.0) -> int:
    """Send ``signum`` to ``proc`` alone (as `kill` or a process manager does); within ``within_s``
    every process of ``pids`` is gone and every port is free. Kills the leftovers either way, so a
    failing test leaves nothing running. Returns ``proc``'s exit status."""
    started = time.monotonic()
    proc.send_signal(signum)
    try:
        left = left_after(pids, within_s)
        assert not left, (f"still running {within_s:.0f} s after {signal.Signals(signum).name}:\n"
                          + "\n".join(describe(left)))
        busy = [port for port in ports if not port_free(port)]
        assert not busy, f"ports still bound after every process exited: {busy}"
        code = proc.wait(max(0.1, within_s - (time.monotonic() - started)))
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code
